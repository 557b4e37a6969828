"""The Kubernetes manifests in deploy/kubernetes, checked as a cluster and the daemon would:

- every core object (Namespace, ConfigMap, DaemonSet, Service, Pod) against the Kubernetes JSON
  schemas of `kubernetes-validate`, strictly (an unknown field is an error, as with
  `kubectl apply --validate=strict`), for the oldest and newest Kubernetes versions we support;
- the Prometheus operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule) against the
  operator's own CRD schemas, vendored in tests/crds, also strictly;
- both kustomizations built by `kubectl kustomize`, alone and with each opt-in component
  (networkpolicy/, tls/), and their output validated the same way;
- the trainer example: its script compiles, and its command runs with the client copied the way
  its init container copies it from the image the Dockerfile builds;
- the NetworkPolicy: port 9477 from the Prometheus pods only;
- the TLS component's web config, run by the real daemon with a certificate from the README's
  recipe, and the monitors scraping with https, the CA and basic auth;
- the PrometheusRule against dashboards/prometheus/gpumon.rules.yml (same groups and rules) and
  through `promtool check rules`;
- the ConfigMap's gpumon.toml run by the real daemon (target/debug/gpumon) until it is ready;
- the values that must agree between files (port, paths, uid/gid).

Tools that are missing (promtool, the daemon binary) skip their test, or fail it when
GPUMON_REQUIRE_TOOLS=1 (scripts/check sets it); a missing kubectl only skips.
"""

import base64
import copy
import http.client
import os
import pathlib
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request

import jsonschema
import kubernetes_validate
import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
KDIR = HERE.parent
ROOT = KDIR.parent.parent
RULES = ROOT / "dashboards" / "prometheus" / "gpumon.rules.yml"
CRD_DIR = HERE / "crds"
# Oldest Kubernetes the manifests are meant for, and the newest the validator knows.
K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version() + ".0"]
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
KUSTOMIZATIONS = [KDIR, KDIR / "podmonitor"]
# Opt-in kustomize components, added to either kustomization with `components:`.
COMPONENTS = [KDIR / "networkpolicy", KDIR / "tls"]
README = KDIR / "README.md"
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
CLIENT_PACKAGE = ROOT / "clients" / "python" / "gpumon_client"


def kustomization_files():
    return sorted(p for p in KDIR.rglob("kustomization.yaml") if HERE not in p.parents)


def patch_files():
    """The files kustomizations use as patches: parts of objects, not objects to apply."""
    found = set()
    for kfile in kustomization_files():
        for patch in yaml.safe_load(kfile.read_text()).get("patches") or []:
            if "path" in patch:
                found.add((kfile.parent / patch["path"]).resolve())
    return found


def manifest_files():
    """Every YAML file under deploy/kubernetes that is an object to apply."""
    patches = patch_files()
    return sorted(
        p
        for p in KDIR.rglob("*.yaml")
        if HERE not in p.parents and p.name != "kustomization.yaml" and p.resolve() not in patches
    )


def load_docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_docs():
    return [(p, d) for p in manifest_files() for d in load_docs(p)]


def one(kind, name=None):
    found = [
        d
        for _, d in all_docs()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def require_tool(name, always_skip=False):
    path = shutil.which(name)
    if path is None:
        if os.environ.get("GPUMON_REQUIRE_TOOLS") == "1" and not always_skip:
            pytest.fail(f"{name} is not installed")
        pytest.skip(f"{name} is not installed")
    return path


# --- schemas ---------------------------------------------------------------------------------


def _strict(schema):
    """The CRD schema with unknown fields refused: the API server would prune them silently, so
    a misspelt field (honorLabel) would be dropped, not rejected."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_schemas():
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            api = f"{crd['spec']['group']}/{version['name']}"
            root = _strict(version["schema"]["openAPIV3Schema"])
            # metadata is ObjectMeta, which the CRD leaves open: checked by _check_metadata.
            root["properties"]["metadata"] = {"type": "object"}
            schemas[(api, crd["spec"]["names"]["kind"])] = root
    return schemas


CRD_SCHEMAS = _crd_schemas()


def _check_metadata(doc):
    meta = doc.get("metadata") or {}
    name = meta.get("name", "")
    assert name and len(name) <= 253, f"{doc['kind']}: metadata.name missing or too long"
    for key, value in (meta.get("labels") or {}).items():
        assert isinstance(value, str), f"{doc['kind']} {name}: label {key} must be a string"


def validate(doc):
    """Raises on an invalid object: jsonschema's or kubernetes-validate's ValidationError."""
    if doc["kind"] in OPERATOR_KINDS:
        schema = CRD_SCHEMAS[(doc["apiVersion"], doc["kind"])]
        jsonschema.Draft202012Validator(schema).validate(doc)
        _check_metadata(doc)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_vendored_crds_are_the_three_operator_kinds():
    kinds = {kind for (_, kind) in CRD_SCHEMAS}
    assert kinds == OPERATOR_KINDS


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KDIR)))
def test_every_manifest_is_valid(path):
    docs = load_docs(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize(
    "break_it",
    [
        # A port as a string: a type error the core schema catches.
        (
            "DaemonSet",
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(
                containerPort="9477"
            ),
        ),
        # A misspelt field: only strict validation catches it.
        ("DaemonSet", lambda d: d["spec"]["template"]["spec"].update(hostPid=True)),
        ("Service", lambda d: d["spec"]["ports"][0].pop("port")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(honorLabel=True)),
        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval=15)),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr")),
    ],
    ids=lambda b: b[0],
)
def test_a_broken_manifest_is_refused(break_it):
    kind, mutate = break_it
    doc = copy.deepcopy(one(kind))
    validate(doc)
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


def test_every_manifest_is_in_a_kustomization_or_an_example():
    listed = set()
    for kfile in kustomization_files():
        k = yaml.safe_load(kfile.read_text())
        for res in k.get("resources") or []:
            target = (kfile.parent / res).resolve()
            assert target.exists(), f"{kfile} lists missing {res}"
            listed.add(target)
        for patch in k.get("patches") or []:
            if "path" in patch:
                assert (kfile.parent / patch["path"]).exists(), f"{kfile}: no {patch['path']}"
    for path in manifest_files():
        assert path in listed or path.parent == KDIR / "examples", f"{path} is in no kustomization"


def test_the_components_are_components_the_kustomizations_name():
    # README.md tells to add them under `components:`; both kustomizations show the lines.
    for comp in COMPONENTS:
        k = yaml.safe_load((comp / "kustomization.yaml").read_text())
        assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
        for kdir in KUSTOMIZATIONS:
            text = (kdir / "kustomization.yaml").read_text()
            assert "# components:" in text
            assert f"#   - {os.path.relpath(comp, kdir)}\n" in text, (kdir, comp.name)


def kustomize_build(kdir, components=()):
    """The objects `kubectl kustomize` makes of kdir with the components added, built from a
    copy so that the checkout is left as it is."""
    kubectl = require_tool("kubectl", always_skip=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "kubernetes"
        shutil.copytree(KDIR, tree, ignore=shutil.ignore_patterns("tests"))
        target = tree / kdir.relative_to(KDIR)
        if components:
            kfile = target / "kustomization.yaml"
            k = yaml.safe_load(kfile.read_text())
            k["components"] = [os.path.relpath(c, kdir) for c in components]
            kfile.write_text(yaml.safe_dump(k))
        out = subprocess.run(
            [kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


COMBINATIONS = [
    (kdir, comps)
    for kdir in KUSTOMIZATIONS
    for comps in ([], [COMPONENTS[0]], [COMPONENTS[1]], COMPONENTS)
]


@pytest.mark.parametrize(
    "kdir,components",
    COMBINATIONS,
    ids=lambda v: v.name if isinstance(v, pathlib.Path) else "+".join(c.name for c in v) or "alone",
)
def test_kustomize_builds_valid_objects_in_the_namespace(kdir, components):
    # Skipped, never failed, without kubectl: scripts/check cannot install a current one (the
    # distribution's kubectl 1.20 predates directories under `resources:`); every file is still
    # validated on its own above.
    docs = kustomize_build(kdir, components)
    kinds = sorted(d["kind"] for d in docs)
    monitor = ["ServiceMonitor", "Service"] if kdir == KDIR else ["PodMonitor"]
    rbac = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    expected = ["ConfigMap", "DaemonSet", "Namespace", "PrometheusRule", *monitor, *rbac]
    names = {c.name for c in components}
    expected += ["NetworkPolicy"] if "networkpolicy" in names else []
    expected += ["Secret"] if "tls" in names else []
    assert kinds == sorted(expected)
    for doc in docs:
        validate(doc)
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "gpumon", doc["kind"]
    # Without tls/ the daemon serves plain HTTP, as it always did.
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--web.config.file" in args) == ("tls" in names)


# --- the alert rules -------------------------------------------------------------------------


def test_the_prometheusrule_has_the_rules_file_groups():
    rules = yaml.safe_load(RULES.read_text())
    assert one("PrometheusRule")["spec"]["groups"] == rules["groups"]


def test_the_prometheusrule_is_what_the_generator_writes():
    out = subprocess.run(
        [str(KDIR / "generate-prometheusrule"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_promtool_accepts_the_prometheusrule_rules():
    promtool = require_tool("promtool")
    spec = one("PrometheusRule")["spec"]
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "rules.yml"
        path.write_text(yaml.safe_dump({"groups": spec["groups"]}))
        out = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stdout + out.stderr
    total = sum(len(g["rules"]) for g in spec["groups"])
    assert f"SUCCESS: {total} rules found" in out.stdout


# --- the pieces that must agree --------------------------------------------------------------


def _daemon():
    ds = one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "gpumon")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    return ds, pod, container, mounts, volumes


def _config():
    return tomllib.loads(one("ConfigMap", "gpumon-config")["data"]["gpumon.toml"])


def test_the_config_the_daemonset_and_the_service_agree():
    ds, pod, container, mounts, volumes = _daemon()
    config = _config()
    args = container["args"]
    config_path = pathlib.PurePosixPath(args[args.index("--config") + 1])
    assert config_path.parent == pathlib.PurePosixPath(mounts["config"]["mountPath"])
    assert volumes["config"]["configMap"]["name"] == "gpumon-config"
    assert config_path.name in one("ConfigMap", "gpumon-config")["data"]

    port = int(config["listen"].rsplit(":", 1)[1])
    assert container["ports"][0] == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    assert one("Service")["spec"]["ports"][0]["targetPort"] == "metrics"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"

    assert config["procfs"] == mounts["host-proc"]["mountPath"]
    assert mounts["host-proc"]["readOnly"] is True
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert pod["hostPID"] is True

    socket_dir = pathlib.PurePosixPath(config["socket"]).parent
    assert str(socket_dir) == mounts["socket-dir"]["mountPath"]
    host_dir = volumes["socket-dir"]["hostPath"]["path"]

    # The trainer example mounts the same host directory and points GPUMON_SOCKET into it.
    trainer = one("Pod")
    tvol = next(v for v in trainer["spec"]["volumes"] if "hostPath" in v)
    assert tvol["hostPath"]["path"] == host_dir
    tc = trainer["spec"]["containers"][0]
    tmount = next(m for m in tc["volumeMounts"] if m["name"] == tvol["name"])
    env = {e["name"]: e["value"] for e in tc["env"]}
    assert pathlib.PurePosixPath(env["GPUMON_SOCKET"]).parent == pathlib.PurePosixPath(
        tmount["mountPath"]
    )
    assert pathlib.PurePosixPath(env["GPUMON_SOCKET"]).name == pathlib.PurePosixPath(
        config["socket"]
    ).name

    # The socket is mode 0660, owned by the daemon's uid and gid: trainers join that group,
    # and the init container hands the host directory to that uid and gid.
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["runAsGroup"] in trainer["spec"]["securityContext"]["supplementalGroups"]
    init = pod["initContainers"][0]
    assert f"chown {sc['runAsUser']}:{sc['runAsGroup']} {host_dir}" in " ".join(init["command"])


def test_every_container_is_locked_down_and_bounded():
    _, pod, _, _, _ = _daemon()
    for c in pod["initContainers"] + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), c["name"]
    # Only the init container runs as root, with only what chown and chmod need.
    init = pod["initContainers"][0]
    assert set(init["securityContext"]["capabilities"]["add"]) == {"CHOWN", "FOWNER"}
    assert "add" not in pod["containers"][0]["securityContext"]["capabilities"]


def test_every_monitor_scrapes_with_prometheus_labels_and_names_the_job_gpumon():
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        spec = one(kind)["spec"]
        # gpumon's series carry no label Prometheus sets (the trainer's job is job_name): the
        # default honorLabels (false) keeps `job` the scrape job, as overrideHonorLabels forces.
        assert all("honorLabels" not in e for e in spec[endpoints]), kind
        assert all(e["port"] == "metrics" for e in spec[endpoints]), kind
        for e in spec[endpoints]:
            drop = [r for r in e["relabelings"] if r.get("action") == "labeldrop"]
            assert drop and all(
                re.fullmatch(drop[0]["regex"], label) for label in ("namespace", "pod", "container")
            ), kind
        # GpumonTargetDown selects up{job=~"gpumon.*"}: the job comes from this label's value.
        pod_labels = one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[spec["jobLabel"]] == "gpumon"
        assert one("Service")["metadata"]["labels"][spec["jobLabel"]] == "gpumon"
    assert 'up{job=~"gpumon.*"}' in RULES.read_text()


# --- the config, run by the daemon -----------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpumon_binary():
    binary = ROOT / "target" / "debug" / "gpumon"
    if not binary.exists():
        if os.environ.get("GPUMON_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{binary} is missing: cargo build")
        pytest.skip(f"{binary} is missing: cargo build")
    return binary


def _start_daemon(tmp, port, *extra):
    """The daemon with the ConfigMap's config, as the pod runs it. Only what exists in the pod
    and not here is replaced by flags: the host's /proc mount, the host's socket directory, the
    pod's address."""
    binary = _gpumon_binary()
    conf = pathlib.Path(tmp) / "gpumon.toml"
    conf.write_text(one("ConfigMap", "gpumon-config")["data"]["gpumon.toml"])
    cmd = [
        str(binary), "--config", str(conf), "daemon",
        "--procfs", "/proc",
        "--socket", str(pathlib.Path(tmp) / "ingest.sock"),
        "--listen", f"127.0.0.1:{port}",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _stop_daemon(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=15)
    return output


def test_the_daemon_starts_with_the_configmap_config():
    _gpumon_binary()
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = _start_daemon(tmp, port)
        try:
            ready = False
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                        ready = r.status == 200
                except (urllib.error.URLError, ConnectionError):
                    pass
                if ready:
                    break
                time.sleep(0.1)
            assert ready, f"daemon exited {proc.poll()} or never became ready"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert b"gpumon_nvml_up" in r.read()
        finally:
            output = _stop_daemon(proc)
        assert proc.returncode == 0, output
        # log_format = "json": every line the daemon wrote is a JSON object.
        lines = [line for line in output.splitlines() if line.strip()]
        assert lines and all(line.startswith("{") for line in lines), output


def test_the_kubelet_lookup_has_its_token_address_and_only_the_permission_it_needs():
    _, pod, container, mounts, volumes = _daemon()
    kube = _config()["kubernetes"]
    # The URL names the node's IP, which the downward API gives the container.
    assert kube["kubelet_url"] == "https://${NODE_IP}:10250"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    # Token and CA are the projected volume, mounted into the daemon's container only.
    mount = pathlib.PurePosixPath(mounts["kubelet-token"]["mountPath"])
    sources = volumes["kubelet-token"]["projected"]["sources"]
    token = next(s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s)
    ca = next(s["configMap"] for s in sources if "configMap" in s)
    assert kube["token_file"] == str(mount / token["path"])
    assert kube["ca_file"] == str(mount / ca["items"][0]["path"])
    assert ca["name"] == "kube-root-ca.crt"
    assert kube["insecure_skip_verify"] is False
    assert pod["automountServiceAccountToken"] is False
    assert all("kubelet-token" not in {m["name"] for m in c.get("volumeMounts", [])}
               for c in pod["initContainers"])
    # The daemon's uid reads the token through the pod's fsGroup.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # The service account is bound to get on nodes/pods, nothing more.
    sa = one("ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    role = one("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}]
    binding = one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "gpumon"}
    ]


# --- the trainer example: the client put in by an init container ------------------------------


def _dockerfile_stages():
    """The Dockerfile's stages, in order: (base image, name or None, instructions), with
    continuation lines joined and comments left out."""
    stages = []
    logical = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        logical += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words = logical.split()
        if words[0].upper() == "FROM":
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else None
            stages.append((words[1], name, []))
        else:
            stages[-1][2].append(logical)
        logical = ""
    return stages


def _copies(instructions):
    """COPY SRC DEST pairs from the build context (not --from another stage)."""
    return [
        tuple(i.split()[1:])
        for i in instructions
        if i.split()[0].upper() == "COPY" and not i.split()[1].startswith("--")
    ]


def _trainer():
    pod = one("Pod", "trainer-example")
    spec = pod["spec"]
    train = next(c for c in spec["containers"] if c["name"] == "train")
    init = next(c for c in spec["initContainers"] if c["name"] == "gpumon-client")
    volumes = {v["name"]: v for v in spec["volumes"]}
    return spec, train, init, volumes


def _mount_of(container, volume):
    return next(m for m in container["volumeMounts"] if m["name"] == volume)


def _mount_at(container, path):
    """The mount that holds `path` in the container (the deepest, where mounts nest)."""
    path = pathlib.PurePosixPath(path)
    found = [
        m for m in container["volumeMounts"]
        if path == pathlib.PurePosixPath(m["mountPath"])
        or pathlib.PurePosixPath(m["mountPath"]) in path.parents
    ]
    assert found, f"{path} is on no volume of {container['name']}"
    return max(found, key=lambda m: len(pathlib.PurePosixPath(m["mountPath"]).parts))


def _script_path(train):
    cmd = train["command"]
    # `python -m gpumon_client run [OPTIONS] SCRIPT ARGS`: the client's own launcher.
    assert cmd[:4] == ["python", "-m", "gpumon_client", "run"], cmd
    return pathlib.PurePosixPath(next(a for a in cmd[4:] if a.endswith(".py")))


def test_the_trainer_examples_script_is_python_from_its_configmap():
    spec, train, _, volumes = _trainer()
    script = _script_path(train)
    mount = _mount_at(train, script)
    assert mount["readOnly"] is True
    cm_name = volumes[mount["name"]]["configMap"]["name"]
    data = one("ConfigMap", cm_name)["data"]
    relative = script.relative_to(mount["mountPath"])
    source = data[str(relative)]
    compile(source, str(script), "exec")
    # A real training loop, on the GPU when torch sees one, else on the CPU.
    assert 'torch.device("cuda" if torch.cuda.is_available() else "cpu")' in source
    assert "loss.backward()" in source and "opt.step()" in source


def test_the_trainer_runs_through_the_client_from_the_init_containers_volume():
    spec, train, init, volumes = _trainer()
    assert "--job" in train["command"]
    env = {e["name"]: e["value"] for e in train["env"]}
    pythonpath = env["PYTHONPATH"]
    # The directory on PYTHONPATH is a read-only mount of an emptyDir the init container fills.
    mount = _mount_of(train, _mount_at(train, pythonpath)["name"])
    assert mount["mountPath"] == pythonpath and mount["readOnly"] is True
    assert "emptyDir" in volumes[mount["name"]]
    init_mount = _mount_of(init, mount["name"])
    cmd = init["command"]
    assert cmd[:2] == ["cp", "-R"] and len(cmd) == 4, cmd
    source, dest = pathlib.PurePosixPath(cmd[2]), pathlib.PurePosixPath(cmd[3])
    # cp -R SRC DIR/ puts the package at DIR/gpumon_client: on the trainer's PYTHONPATH.
    assert source.name == "gpumon_client"
    assert dest == pathlib.PurePosixPath(init_mount["mountPath"])
    assert init_mount["mountPath"] == mount["mountPath"]
    # What the init container copies is where the client image puts the package.
    stages = {name: (base, ins) for base, name, ins in _dockerfile_stages()}
    base, instructions = stages["client"]
    assert base.startswith("busybox:")
    assert ("clients/python/gpumon_client", str(source)) in _copies(instructions)
    assert init["image"].split("/")[-1].split(":")[0] == "gpumon-client"
    # The hostPath socket directory stays (test_the_config_the_daemonset_and_the_service_agree).
    assert any("hostPath" in v for v in volumes.values())
    # Both containers run locked down, as the pod's non-root user.
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in (init, train):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]


def test_the_dockerfile_ships_the_client_in_both_images():
    stages = _dockerfile_stages()
    # The last stage is what a build without --target makes: the daemon.
    base, name, final = stages[-1]
    assert base.startswith("gcr.io/distroless/")
    assert 'ENTRYPOINT ["/usr/bin/gpumon"]' in final
    package = ("clients/python/gpumon_client", "/usr/share/gpumon/python/gpumon_client")
    assert package in _copies(final)
    client = next(ins for _, n, ins in stages if n == "client")
    assert package in _copies(client)
    # The client's busybox is the one the DaemonSet's init container already pulls.
    busybox = next(b for b, n, _ in stages if n == "client")
    _, pod, _, _, _ = _daemon()
    assert busybox == pod["initContainers"][0]["image"]
    # The package is pure Python, and the build context keeps it (the .dockerignore).
    files = [p for p in CLIENT_PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert {"__init__.py", "__main__.py"} <= {p.name for p in files}
    assert all(p.suffix == ".py" for p in files), [p for p in files if p.suffix != ".py"]
    ignored = [
        line.strip()
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(
        part in ("clients", "python", "gpumon_client") for pat in ignored for part in pat.split("/")
    ), ignored


def _as_in_pod(root, value):
    """A pod's absolute path, under `root` here."""
    return str(root / value.lstrip("/")) if value.startswith("/") else value


def _run_trainer_example(tmp, script_source=None, extra_env=None, python=sys.executable):
    """The init container's and the trainer's commands run here, their paths under tmp: the
    client image's package copied into the volume, then `python -m gpumon_client run SCRIPT`
    with the trainer's environment."""
    root = pathlib.Path(tmp)
    spec, train, init, volumes = _trainer()
    image_copy = next(
        dest for src, dest in _copies(next(i for _, n, i in _dockerfile_stages() if n == "client"))
        if src == "clients/python/gpumon_client"
    )
    shutil.copytree(
        CLIENT_PACKAGE,
        _as_in_pod(root, image_copy),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for c in (init, train):
        for m in c["volumeMounts"]:
            pathlib.Path(_as_in_pod(root, m["mountPath"])).mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [_as_in_pod(root, a) for a in init["command"]], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    script = _script_path(train)
    mount = _mount_at(train, script)
    data = one("ConfigMap", volumes[mount["name"]]["configMap"]["name"])["data"]
    for key, value in data.items():
        pathlib.Path(_as_in_pod(root, mount["mountPath"]), key).write_text(value)
    if script_source is not None:
        pathlib.Path(_as_in_pod(root, str(script))).write_text(script_source)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUMON_") and k not in ("PYTHONPATH", "PYTHONHOME")
    }
    env.update({e["name"]: _as_in_pod(root, e["value"]) for e in train["env"]})
    env.update(extra_env or {})
    cmd = [python] + [_as_in_pod(root, a) for a in train["command"][1:]]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


def test_the_trainer_examples_command_runs_with_the_client_as_the_init_container_copies_it():
    # A stand-in script in place of train.py (this Python may have no torch): it shows which
    # gpumon_client ran it, and that the script runs as `python SCRIPT` would run it.
    stand_in = (
        "import sys, gpumon_client\n"
        "print('client', gpumon_client.__file__)\n"
        "print('argv', sys.argv)\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_trainer_example(tmp, stand_in, {"GPUMON_DISABLE": "1"})
        assert out.returncode == 0, out.stdout + out.stderr
        _, train, _, _ = _trainer()
        env = {e["name"]: e["value"] for e in train["env"]}
        volume = _as_in_pod(pathlib.Path(tmp), env["PYTHONPATH"])
        assert f"client {volume}/gpumon_client/__init__.py" in out.stdout, out.stdout
        assert "argv ['" in out.stdout and "train.py']" in out.stdout, out.stdout


def test_the_trainer_examples_script_trains_through_the_client():
    # Needs a Python with torch: GPUMON_TORCH_PYTHON (scripts/check points it at its torch venv),
    # else this one. Without torch it skips, or fails where GPUMON_REQUIRE_TOOLS=1.
    python = os.environ.get("GPUMON_TORCH_PYTHON") or sys.executable
    has_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    if not has_torch:
        if os.environ.get("GPUMON_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{python} has no torch: set GPUMON_TORCH_PYTHON to one that has")
        pytest.skip("torch is not installed in this Python")
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_trainer_example(
            tmp, None, {"TRAIN_STEPS": "20", "TRAIN_STEP_PAUSE_SECONDS": "0"}, python=python
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "for 20 steps" in out.stdout and "step 20 loss" in out.stdout and "done" in out.stdout


# --- the NetworkPolicy component -------------------------------------------------------------


def test_the_networkpolicy_lets_only_prometheus_reach_the_metrics_port():
    policy = one("NetworkPolicy")
    ds, pod, container, _, _ = _daemon()
    spec = policy["spec"]
    # It selects the daemon's pods, and only restricts what comes in: the daemon still reaches
    # the kubelet.
    assert spec["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    port = int(_config()["listen"].rsplit(":", 1)[1])
    assert port == container["ports"][0]["containerPort"] == 9477
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    # One peer with both selectors: pods labelled as Prometheus in the monitoring namespace
    # (two peers would allow either).
    [peer] = rule["from"]
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    comp = yaml.safe_load((KDIR / "networkpolicy" / "kustomization.yaml").read_text())
    assert comp["resources"] == ["networkpolicy.yaml"]


# --- the TLS component -----------------------------------------------------------------------

TLS = KDIR / "tls"
# bcrypt (cost 10) of the passwords below, for the daemon run with the component's web config.
TEST_USERS = {
    "prometheus": (
        "prometheus-password",
        "$2b$10$WRheV0oc/9mitqrq9BuAge2fMNj02eMjeXuz4wcGXwrsnmVYddisi",
    ),
    "probe": ("probe-password", "$2b$10$v3095172C2qlptuM3gWTge3sHo6mH6lHjHPCsvKMa4nk.Gfl7.H8m"),
}


def _web_config_secret():
    return one("Secret", "gpumon-web-config")


def _monitor_patch_ops(name):
    ops = yaml.safe_load((TLS / name).read_text())
    return {op["path"].rsplit("/", 1)[1]: op["value"] for op in ops if op["op"] == "add"}


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_the_tls_component_mounts_the_web_config_and_the_monitors_scrape_https(kdir):
    docs = kustomize_build(kdir, [TLS])
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "gpumon")
    volumes = {v["name"]: v for v in pod["volumes"]}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}

    # --web.config.file, a daemon flag, after the subcommand, naming a file of a mounted Secret.
    args = container["args"]
    assert args[-2] == "--web.config.file" and args.index("daemon") < len(args) - 2
    web_path = pathlib.PurePosixPath(args[-1])
    mount = _mount_at(container, web_path)
    assert mount["readOnly"] is True and "subPath" not in mount  # subPath would never update
    secret = volumes[mount["name"]]["secret"]
    data = secrets[secret["secretName"]]["stringData"]
    web = yaml.safe_load(data[str(web_path.relative_to(mount["mountPath"]))])
    # Readable by the daemon's group (fsGroup), no one else.
    assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 9477

    # The certificate and key: files of the TLS Secret's volume, under kubernetes.io/tls names.
    tls = web["tls_server_config"]
    cert_mount = _mount_at(container, tls["cert_file"])
    assert cert_mount == _mount_at(container, tls["key_file"]) and cert_mount["readOnly"] is True
    tls_secret = volumes[cert_mount["name"]]["secret"]
    assert tls_secret["defaultMode"] == 0o440
    assert pathlib.PurePosixPath(tls["cert_file"]).name == "tls.crt"
    assert pathlib.PurePosixPath(tls["key_file"]).name == "tls.key"
    assert set(web["basic_auth_users"]) == set(TEST_USERS)

    # The probes: HTTPS, with the probe user's credentials (basic auth covers /healthz too).
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["scheme"] == "HTTPS" and get["port"] == "metrics", probe
        [header] = get["httpHeaders"]
        assert header["name"] == "Authorization" and header["value"].startswith("Basic "), probe

    # The monitor: https, the CA from the TLS Secret, basic auth from the scrape Secret, and the
    # name the certificate carries (the README's recipe).
    if kdir == KDIR:
        kind, key = "ServiceMonitor", "endpoints"
    else:
        kind, key = "PodMonitor", "podMetricsEndpoints"
    [endpoint] = next(d for d in docs if d["kind"] == kind)["spec"][key]
    assert endpoint["scheme"] == "https" and "honorLabels" not in endpoint
    assert endpoint["tlsConfig"]["ca"] == {
        "secret": {"name": tls_secret["secretName"], "key": "ca.crt"}
    }
    assert endpoint["tlsConfig"]["serverName"] == f"gpumon.{ds['metadata']['namespace']}.svc"
    assert "NAME=gpumon.gpumon.svc" in _readme_block("certificate recipe")
    auth = endpoint["basicAuth"]
    assert auth["username"]["name"] == auth["password"]["name"] == "gpumon-scrape-auth"
    assert (auth["username"]["key"], auth["password"]["key"]) == ("username", "password")


def test_the_tls_components_files_agree_with_each_other():
    # The same checks as the build above on the component's own files, without kubectl.
    pod = yaml.safe_load((TLS / "daemonset-patch.yaml").read_text())["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"]}
    k = yaml.safe_load((TLS / "kustomization.yaml").read_text())
    inline = next(p for p in k["patches"] if "patch" in p)
    values = [op["value"] for op in yaml.safe_load(inline["patch"]) if op["op"] == "add"]
    assert values[0] == "--web.config.file"
    web_path = pathlib.PurePosixPath(values[1])
    name = _web_config_secret()["metadata"]["name"]
    web_mount = next(m for m, s in vols.items() if s == name)
    assert web_path.parent == pathlib.PurePosixPath(mounts[web_mount])
    web = yaml.safe_load(_web_config_secret()["stringData"][web_path.name])
    tls_mount = pathlib.PurePosixPath(mounts[next(m for m, s in vols.items() if s == "gpumon-tls")])
    for f in ("cert_file", "key_file"):
        assert pathlib.PurePosixPath(web["tls_server_config"][f]).parent == tls_mount
    for name in ("servicemonitor-patch.yaml", "podmonitor-patch.yaml"):
        ops = _monitor_patch_ops(name)
        assert ops["scheme"] == "https" and ops["tlsConfig"]["ca"]["secret"]["name"] == "gpumon-tls"


def _readme_block(marker):
    """The shell block that follows `<!-- MARKER ... -->` in README.md, unindented."""
    text = README.read_text()
    after = text[text.index(f"<!-- {marker}") :]
    block = after.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def _https(port, path, server_name, ca, user=None):
    """GET over TLS to 127.0.0.1:port as Prometheus makes it: the certificate checked against
    the CA and the monitor's serverName, basic auth when a user is given."""
    ctx = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection(server_name, port, context=ctx, timeout=10)
    # Dial the local daemon, while TLS checks the certificate for server_name.
    conn._create_connection = lambda addr, *a, **kw: socket.create_connection(
        ("127.0.0.1", addr[1]), *a, **kw
    )
    headers = {}
    if user:
        password = TEST_USERS[user][0]
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_the_daemon_serves_tls_and_basic_auth_with_the_components_web_config():
    _gpumon_binary()
    require_tool("openssl")
    bash = require_tool("bash")
    server_name = _monitor_patch_ops("servicemonitor-patch.yaml")["tlsConfig"]["serverName"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # The README's certificate recipe, as it stands.
        out = subprocess.run(
            [bash, "-euo", "pipefail", "-c", _readme_block("certificate recipe")],
            cwd=tmp, capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        # The files as the Secret gpumon-tls puts them in the pod (README.md's kubectl command).
        tls_dir = tmp / "tls"
        tls_dir.mkdir()
        shutil.copy(tmp / "server.pem", tls_dir / "tls.crt")
        shutil.copy(tmp / "server.key", tls_dir / "tls.key")
        web = yaml.safe_load(_web_config_secret()["stringData"]["web.yml"])
        for key in ("cert_file", "key_file"):
            name = pathlib.PurePosixPath(web["tls_server_config"][key]).name
            web["tls_server_config"][key] = str(tls_dir / name)
        web_file = tmp / "web.yml"

        # As shipped, the placeholders stop the daemon at start: exit 78, naming the key.
        web_file.write_text(yaml.safe_dump(web))
        proc = _start_daemon(tmp, _free_port(), "--web.config.file", str(web_file))
        try:
            output, _ = proc.communicate(timeout=30)
        finally:
            _stop_daemon(proc)
        assert proc.returncode == 78, output
        assert "basic_auth_users." in output and "is not a bcrypt hash" in output, output

        # With hashes in place it serves TLS and asks every request for a password.
        web["basic_auth_users"] = {user: TEST_USERS[user][1] for user in web["basic_auth_users"]}
        web_file.write_text(yaml.safe_dump(web))
        port = _free_port()
        proc = _start_daemon(tmp, port, "--web.config.file", str(web_file))
        ca = str(tmp / "ca.pem")
        try:
            status = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    status, _ = _https(port, "/readyz", server_name, ca, "probe")
                except (ConnectionError, OSError):
                    pass
                if status == 200:
                    break
                time.sleep(0.2)
            assert status == 200, f"daemon exited {proc.poll()} or /readyz never answered 200"
            assert _https(port, "/healthz", server_name, ca, "probe")[0] == 200
            assert _https(port, "/readyz", server_name, ca)[0] == 401
            assert _https(port, "/metrics", server_name, ca)[0] == 401
            status, body = _https(port, "/metrics", server_name, ca, "prometheus")
            assert status == 200 and b"gpumon_nvml_up" in body
            # The name Prometheus checks is the certificate's; another is refused.
            with pytest.raises(ssl.SSLCertVerificationError):
                _https(port, "/healthz", "gpumon.elsewhere.svc", ca, "probe")
        finally:
            output = _stop_daemon(proc)
        assert proc.returncode == 0, output
        assert '"tls":true' in output and '"basic_auth_users":2' in output, output
