"""The package's layout, as the README's Development section states it: no import cycle among its
modules, the snapshot tools in layers and apart from the client, `import gpumon_client` loading
none of them, and a wheel that holds the package and nothing else (no bench or test module)."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

CLIENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "gpumon_client"
SNAPSHOT = PACKAGE + ".snapshot"

# The snapshot tools' layers, in order: a module imports only from its own layer or earlier ones.
LAYERS = [
    ("reading", {"picklebase", "pickleschema", "picklerare", "pickleread", "shape", "load"}),
    ("analysis", {"units", "sites", "state", "diff", "explain", "peak", "trim", "wire"}),
    ("rendering", {"render"}),
    ("cli", {"cli"}),
]
# Modules that only name the snapshot tools at their former, documented paths.
ALIASES = {"snapdiff", "explain", "snapload", "pickleread"}


def modules(root, package):
    """{dotted module name: path} for every .py under root/package (a package is its __init__)."""
    out = {}
    base = os.path.join(root, package)
    for d, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), root)[: -len(".py")].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(d, f)
    return out


def imports(name, path, known):
    """The modules of `known` that `name` imports anywhere in its source: at module level, inside
    functions, under `if TYPE_CHECKING:` alike (ast.walk sees every import statement)."""
    is_pkg = os.path.basename(path) == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = base + "." + node.module if node.module else base
            else:
                base = node.module or ""
            # `from pkg import x`: x is a submodule (an import of it) or a name in pkg's __init__.
            subs = ["%s.%s" % (base, a.name) for a in node.names]
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):
                targets.append(base)
        else:
            continue
        for t in targets:
            # `import a.b.c` imports a.b.c; count the deepest module of ours it names.
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph(root, package):
    mods = modules(root, package)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def cycle(g):
    """One import cycle as a list of modules (first repeated last), or None."""
    state = {}
    stack = []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


# --- the checker itself finds what it is for ------------------------------------------------------


def _write(root, files):
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)


@pytest.mark.parametrize("how", ["function", "type_checking", "absolute", "from_package"])
def test_the_checker_finds_a_hidden_cycle(tmp_path, how):
    # The two cycles the package had: one behind an import inside a function (explain's main
    # imported snaptrim), one behind `if TYPE_CHECKING:` (picklerare named pickleread's Reader).
    back = {
        "function": "def main():\n    from . import a\n",
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import Thing\n",
        "absolute": "import pkg.sub.a\n",
        "from_package": "from pkg.sub import a\n",
    }[how]
    _write(str(tmp_path), {"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/a.py": "from .b import f\n",
                           "pkg/sub/b.py": back, "pkg/c.py": "from .sub import b\n"})
    g = graph(str(tmp_path), "pkg")
    assert g["pkg.c"] == {"pkg.sub.b"}
    found = cycle(g)
    assert found is not None and found[0] == found[-1] and set(found) == {"pkg.sub.a", "pkg.sub.b"}, found


def test_the_checker_passes_a_package_without_cycles(tmp_path):
    _write(str(tmp_path), {"pkg/__init__.py": "from .a import f\n", "pkg/a.py": "import os\nfrom .b import g\n",
                           "pkg/b.py": "from typing import TYPE_CHECKING\n"})
    g = graph(str(tmp_path), "pkg")
    assert g == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert cycle(g) is None


# --- the package -------------------------------------------------------------------------------------


def test_no_import_cycle_among_the_packages_modules():
    g = graph(CLIENT, PACKAGE)
    assert SNAPSHOT + ".pickleread" in g and len(g) > 40  # the walk found the package
    found = cycle(g)
    assert found is None, "import cycle: %s" % " -> ".join(found)


def test_the_snapshot_tools_are_in_layers_and_apart_from_the_client():
    g = graph(CLIENT, PACKAGE)
    layer_of = {"%s.%s" % (SNAPSHOT, m): i for i, (_, ms) in enumerate(LAYERS) for m in ms}
    tools = {m for m in g if m.startswith(SNAPSHOT + ".")}
    assert tools == set(layer_of), "each snapshot module belongs to one layer: unplaced %s, gone %s" % (
        sorted(tools - set(layer_of)), sorted(set(layer_of) - tools))
    assert g[SNAPSHOT] == set(), "snapshot/__init__.py imports nothing, so a tool loads only what it needs"
    for m in sorted(tools):
        for t in sorted(g[m]):
            assert t.startswith(SNAPSHOT + "."), "%s imports %s: the snapshot tools import nothing of the client" % (m, t)
            assert layer_of[t] <= layer_of[m], "%s (%s) imports %s (%s), a later layer" % (
                m, LAYERS[layer_of[m]][0], t, LAYERS[layer_of[t]][0])


def test_the_former_paths_only_name_the_snapshot_tools():
    g = graph(CLIENT, PACKAGE)
    for alias in sorted(ALIASES):
        name = "%s.%s" % (PACKAGE, alias)
        assert g[name] and all(t.startswith(SNAPSHOT + ".") for t in g[name]), (name, g[name])
        assert not any(name in targets for targets in g.values()), "%s is an alias: nothing in the package uses it" % name
    from gpumon_client import explain, pickleread, snapdiff, snapload
    from gpumon_client.snapshot import diff, load, pickleread as reader, pickleschema, wire
    from gpumon_client.snapshot import explain as ex_mod

    assert (snapdiff.load, snapdiff.diff, snapdiff.fit) == (load.load, diff.diff, wire.fit)
    assert explain.explain is ex_mod.explain and snapload.load is load.load
    assert (pickleread.read, pickleread.Schema) == (reader.read, pickleschema.Schema)


def _loaded_after(code):
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         cwd=CLIENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return set(json.loads(out.stdout.decode().splitlines()[-1]))


def test_importing_the_client_loads_none_of_the_snapshot_tools():
    loaded = _loaded_after("import gpumon_client\nfrom gpumon_client import Client, Reporter, attach, detach, phase")
    ours = {m for m in loaded if m == PACKAGE or m.startswith(PACKAGE + ".")}
    assert PACKAGE + ".hooks" in ours and PACKAGE + ".client" in ours  # the client itself did load
    heavy = sorted(m for m in ours if m == SNAPSHOT or m.startswith(SNAPSHOT + ".")
                   or m.rpartition(".")[2] in ALIASES)
    assert heavy == [], "import gpumon_client loaded %s" % heavy
    assert not loaded & {"torch", "argparse", "pickletools"}, sorted(loaded & {"torch", "argparse", "pickletools"})


def test_the_snapshot_tools_load_when_asked_for():
    # The other side of the check above: the subprocess does see them when they are imported.
    loaded = _loaded_after("from gpumon_client.snapshot import cli")
    assert {SNAPSHOT + ".cli", SNAPSHOT + ".pickleread", SNAPSHOT + ".render"} <= loaded


# --- the wheel ---------------------------------------------------------------------------------------


def _builds_without_isolation():
    """Whether this Python's setuptools builds a wheel by itself (70.1 and later have bdist_wheel;
    older ones need the `wheel` package): then nothing is downloaded."""
    try:
        import setuptools
    except ImportError:
        return False
    try:
        import wheel  # noqa: F401

        return True
    except ImportError:
        pass
    parts = (setuptools.__version__.split(".") + ["0", "0"])[:2]
    try:
        return (int(parts[0]), int(parts[1])) >= (70, 1)
    except ValueError:
        return False


def test_the_wheel_holds_the_package_and_no_bench_or_test_module(tmp_path):
    # A copy of the whole client directory (bench/, tests/, scripts/ included, as pip sees a
    # checkout), so a build leaves nothing in the source tree.
    src = tmp_path / "src"
    shutil.copytree(CLIENT, str(src), ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)]
    if _builds_without_isolation():
        cmd.insert(4, "--no-build-isolation")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=540)
    assert out.returncode == 0, out.stdout.decode()[-3000:]
    wheels = list((tmp_path / "dist").glob("gpumon_client-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(str(wheels[0])) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {PACKAGE}, tops
    shipped = {n for n in names if n.endswith(".py")}
    source = {os.path.relpath(p, CLIENT).replace(os.sep, "/") for p in modules(CLIENT, PACKAGE).values()}
    assert shipped == source, "in the wheel only: %s; missing from it: %s" % (sorted(shipped - source), sorted(source - shipped))
    assert PACKAGE + "/snapshot/explain.py" in shipped
    # No bench or test module, whatever it is called inside the package.
    kept_out = set()
    for d in ("bench", "tests", "tests_torch", "scripts"):
        kept_out |= {f for f in os.listdir(os.path.join(CLIENT, d)) if f.endswith(".py")}
    leaked = sorted(n for n in shipped if n.rsplit("/", 1)[-1] in kept_out - {"__init__.py"}
                    or n.rsplit("/", 1)[-1].startswith(("test_", "bench_", "conftest")))
    assert leaked == [], leaked


def test_installing_the_oom_observer_loads_what_it_explains_with():
    # The observer runs at an OOM, inside torch's allocator: it must import nothing then. A torch
    # whose CUDA is initialised, reduced to the one call the install makes.
    loaded = _loaded_after(
        "import types\n"
        "from gpumon_client import hooks\n"
        "attached = []\n"
        "torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attached.append),\n"
        "                              cuda=types.SimpleNamespace(is_initialized=lambda: True))\n"
        "assert hooks._install_oom_observer(torch) and attached == [hooks._oom_observer], attached\n")
    assert {SNAPSHOT + ".explain", SNAPSHOT + ".wire"} <= loaded
    assert not {SNAPSHOT + ".pickleread", SNAPSHOT + ".cli", SNAPSHOT + ".render"} & loaded  # not the reader nor the CLI
