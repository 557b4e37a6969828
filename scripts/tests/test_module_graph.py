"""scripts/module-graph's reading of a crate, on small synthetic trees:
`python3 -m pytest -q scripts/tests/test_module_graph.py`."""

import importlib.machinery
import importlib.util
import os
import textwrap

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module-graph")


def _load():
    # The script has no .py suffix (it is run as a command), so it is loaded by path.
    loader = importlib.machinery.SourceFileLoader("module_graph", SCRIPT)
    spec = importlib.util.spec_from_loader("module_graph", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


mg = _load()


def tree(tmp_path, files):
    src = tmp_path / "src"
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(src)


LIB = "pub mod core;\npub mod frontends;\npub mod outputs;\npub mod sources;\npub mod util;\n"


def test_a_cycle_between_siblings_is_found_with_its_lines(tmp_path):
    src = tree(tmp_path, {
        "lib.rs": LIB,
        "core/mod.rs": "pub mod a;\npub mod b;\n",
        "core/a.rs": "use super::b::B;\npub struct A;\n",
        "core/b.rs": "pub struct B;\nfn f() -> crate::core::a::A { crate::core::a::A }\n",
    })
    cycles, upward, _, _ = mg.analyse(src)
    assert upward == {}
    assert len(cycles) == 1
    members, inside = cycles[0]
    assert members == ["core::a", "core::b"]
    assert inside[("core::a", "core::b")] == ["src/core/a.rs:1"]
    # Two paths on one line are one site.
    assert inside[("core::b", "core::a")] == ["src/core/b.rs:2"]


def test_an_upward_import_is_found_in_a_use_tree(tmp_path):
    src = tree(tmp_path, {
        "lib.rs": LIB,
        "core/mod.rs": "pub mod model;\n",
        "core/model.rs": "use crate::{\n    util::x,\n    frontends::tui::{self, Thing},\n};\n",
        "frontends/mod.rs": "pub mod tui;\n",
        "frontends/tui.rs": "use crate::core::model;\npub struct Thing;\n",
        "util.rs": "pub fn x() {}\n",
    })
    cycles, upward, _, _ = mg.analyse(src)
    assert upward == {("core::model", "frontends::tui"): ["src/core/model.rs:3"]}
    assert [m for m, _ in cycles] == [["core::model", "frontends::tui"]]


def test_a_parent_using_its_child_is_not_a_cycle(tmp_path):
    src = tree(tmp_path, {
        "lib.rs": LIB,
        "outputs/mod.rs": "pub mod http;\nuse http::serve;\npub struct Stats;\nfn g() { http::serve() }\n",
        "outputs/http/mod.rs": "pub mod serve;\npub use serve::serve;\nuse super::Stats;\n",
        "outputs/http/serve.rs": "use crate::outputs::Stats;\npub fn serve() {}\n",
    })
    cycles, upward, _, graph = mg.analyse(src)
    assert cycles == [] and upward == {}
    # The child's edge to its parent is kept; the parent's to its children is not.
    assert graph[("outputs", "http")] == {("outputs",)}
    assert ("outputs", "http") not in graph[("outputs",)]


def test_test_code_and_comments_are_not_read(tmp_path):
    src = tree(tmp_path, {
        "lib.rs": LIB,
        "core/mod.rs": textwrap.dedent("""\
            //! Not an import: crate::frontends::x
            pub mod a;
            #[cfg(test)]
            mod tests;
            #[cfg(test)]
            mod inline {
                use crate::frontends::helper;
            }
            #[cfg(all(test, unix))]
            fn only_in_tests() { crate::frontends::helper(); }
            const S: &str = "crate::frontends::y";
            const R: &str = r#"crate::frontends::{z}"#;
            const C: char = '{';
            fn lifetimes<'a>(x: &'a str) -> &'a str { x }
            fn after() { crate::util::x(); }
            """),
        "core/a.rs": "",
        "core/tests.rs": "use crate::frontends::helper;\n",
        "frontends/mod.rs": "pub fn helper() {}\n",
        "util.rs": "pub fn x() {}\n",
    })
    cycles, upward, modules, graph = mg.analyse(src)
    assert upward == {} and cycles == []
    assert ("core", "tests") not in modules
    assert graph[("core",)] == {("util",)}


def test_layer_order_and_unknown_top_modules():
    assert mg.layer_of(("util", "x"))[0] < mg.layer_of(("core",))[0] < mg.layer_of(("sources",))[0]
    assert mg.layer_of(("sources",))[0] < mg.layer_of(("outputs",))[0] < mg.layer_of(("frontends",))[0]
    assert mg.layer_of(("frontends",))[0] < mg.layer_of(("config",))[0] == mg.layer_of(())[0]
    with pytest.raises(SystemExit):
        mg.layer_of(("elsewhere",))


def test_allowlist_entries_name_their_step_and_stale_ones_fail(tmp_path, capsys):
    src = tree(tmp_path, {
        "lib.rs": LIB,
        "sources/mod.rs": "use crate::outputs::Tap;\n",
        "outputs/mod.rs": "pub struct Tap;\n",
    })
    allow = tmp_path / "allow"
    allow.write_text("upward sources -> outputs  # issue 24 step 2: the tap\n")
    assert mg.main(["--src", src, "--allow", str(allow)]) == 0
    allow.write_text("upward sources -> outputs  # later\n")
    assert mg.main(["--src", src, "--allow", str(allow)]) == 1
    allow.write_text("upward sources -> outputs  # issue 24 step 2\nupward core -> outputs  # issue 24 step 3\n")
    assert mg.main(["--src", src, "--allow", str(allow)]) == 1
    assert "no longer happens" in capsys.readouterr().out


CORE_LIB = "pub mod core;\npub mod units;\npub mod util;\n"
CORE_MANIFEST = """\
[package]
name = "gpumon-core"

[dependencies]
serde = { version = "1", features = ["derive"] }
thiserror = "2"
"""


def two_crates(tmp_path, src_files, core_files, manifest=CORE_MANIFEST):
    """gpumon's src and crates/core's, side by side as in the repository: (src, core_src)."""
    src = tree(tmp_path, src_files)
    core = tmp_path / "crates" / "core"
    for rel, text in core_files.items():
        path = core / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (core / "Cargo.toml").write_text(manifest)
    return src, str(core / "src")


def test_the_core_crate_is_read_with_gpumon_as_one_tree(tmp_path):
    src, core_src = two_crates(tmp_path, {
        "lib.rs": "pub mod core;\npub mod sources;\npub use gpumon_core::units;\n",
        # The facade: the core crate's modules under their old paths, and the aggregator.
        "core/mod.rs": "pub use gpumon_core::core::{model, store};\npub mod aggregator;\n",
        "core/aggregator.rs": "use crate::core::store::Store;\nuse crate::sources::x;\n",
        "sources/mod.rs": "use crate::core::model::Reading;\npub fn x() {}\n",
    }, {
        "lib.rs": CORE_LIB,
        "core/mod.rs": "pub mod model;\npub mod store;\n",
        "core/model.rs": "use crate::units::bytes;\npub struct Reading;\n",
        "core/store.rs": "use crate::core::model::Reading;\nfn f() { crate::core::aggregator::run() }\n",
        "units.rs": "pub fn bytes() {}\n",
        "util/mod.rs": "",
    })
    assert mg.core_src_of(src) == core_src
    cycles, upward, modules, graph = mg.analyse(src, core_src=core_src)
    # A path in gpumon names the core crate's module; one in the core crate names gpumon's.
    assert graph[("sources",)] == {("core", "model")}
    assert ("core", "aggregator") in graph[("core", "store")]
    assert upward == {("core::aggregator", "sources"): ["src/core/aggregator.rs:2"]}
    members, inside = cycles[0]
    assert members == ["core::aggregator", "core::store"]
    assert inside[("core::store", "core::aggregator")] == ["crates/core/src/core/store.rs:2"]
    # `core` has a file in each crate.
    assert [s.path for s in modules[("core",)]] == ["src/core/mod.rs", "crates/core/src/core/mod.rs"]
    assert mg.core_crate_problems(src, core_src) == []


def test_the_core_crate_may_not_depend_on_what_sits_above_it(tmp_path):
    manifest = CORE_MANIFEST + textwrap.dedent("""\
        tokio-util = "0.7"
        rt = { package = "tokio", version = "1" }
        main = { path = "../.." }

        [target.'cfg(unix)'.dependencies]
        nvml-wrapper = "0.13"

        [dev-dependencies]
        ratatui = "0.30"
        """)
    src, core_src = two_crates(tmp_path, {"lib.rs": "pub mod core;\n"}, {
        "lib.rs": "pub mod core;\npub mod sources;\n",
        "core/mod.rs": "",
        "sources.rs": "",
    }, manifest)
    problems = mg.core_crate_problems(src, core_src)
    assert problems[0].startswith("crates/core/src/sources.rs: `sources` is above the core crate's layers")
    named = [p.split(": ")[1] for p in problems[1:]]
    assert named == [
        "[dependencies] tokio-util",
        "[dependencies] rt",
        "[dependencies] main",
        "[dev-dependencies] ratatui",
        "[target.cfg(unix).dependencies] nvml-wrapper",
    ]
    assert "must not depend on gpumon " in problems[3]
    assert mg.main(["--src", src, "--allow", str(tmp_path / "none")]) == 1
