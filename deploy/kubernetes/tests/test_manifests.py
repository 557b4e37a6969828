"""The Kubernetes manifests in deploy/kubernetes, checked as a cluster and the daemon would:

- every core object (Namespace, ConfigMap, DaemonSet, Service, Pod) against the Kubernetes JSON
  schemas of `kubernetes-validate`, strictly (an unknown field is an error, as with
  `kubectl apply --validate=strict`), for the oldest and newest Kubernetes versions we support;
- the Prometheus operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule) against the
  operator's own CRD schemas, vendored in tests/crds, also strictly;
- both kustomizations built by `kubectl kustomize`, and their output validated the same way;
- the PrometheusRule against dashboards/prometheus/gpumon.rules.yml (same groups and rules) and
  through `promtool check rules`;
- the ConfigMap's gpumon.toml run by the real daemon (target/debug/gpumon) until it is ready;
- the values that must agree between files (port, paths, uid/gid).

Tools that are missing (promtool, the daemon binary) skip their test, or fail it when
GPUMON_REQUIRE_TOOLS=1 (scripts/check sets it); a missing kubectl only skips.
"""

import copy
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
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


def manifest_files():
    """Every YAML file under deploy/kubernetes that is an object to apply."""
    return sorted(
        p
        for p in KDIR.rglob("*.yaml")
        if HERE not in p.parents and p.name != "kustomization.yaml"
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
        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(honorLabels="yes")),
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
    for kdir in [KDIR / "base", *KUSTOMIZATIONS]:
        k = yaml.safe_load((kdir / "kustomization.yaml").read_text())
        for res in k["resources"]:
            target = (kdir / res).resolve()
            assert target.exists(), f"{kdir}/kustomization.yaml lists missing {res}"
            listed.add(target)
    for path in manifest_files():
        assert path in listed or path.parent == KDIR / "examples", f"{path} is in no kustomization"


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_kustomize_builds_valid_objects_in_the_namespace(kdir):
    # Skipped, never failed, without kubectl: scripts/check cannot install a current one (the
    # distribution's kubectl 1.20 predates directories under `resources:`); every file is still
    # validated on its own above.
    kubectl = require_tool("kubectl", always_skip=True)
    out = subprocess.run(
        [kubectl, "kustomize", str(kdir)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    monitor = ["ServiceMonitor", "Service"] if kdir == KDIR else ["PodMonitor"]
    rbac = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    expected = ["ConfigMap", "DaemonSet", "Namespace", "PrometheusRule", *monitor, *rbac]
    assert kinds == sorted(expected)
    for doc in docs:
        validate(doc)
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "gpumon", doc["kind"]


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


def test_every_monitor_honors_labels_and_names_the_job_gpumon():
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        spec = one(kind)["spec"]
        assert all(e["honorLabels"] is True for e in spec[endpoints]), kind
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


def test_the_daemon_starts_with_the_configmap_config():
    binary = ROOT / "target" / "debug" / "gpumon"
    if not binary.exists():
        if os.environ.get("GPUMON_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{binary} is missing: cargo build")
        pytest.skip(f"{binary} is missing: cargo build")
    with tempfile.TemporaryDirectory() as tmp:
        conf = pathlib.Path(tmp) / "gpumon.toml"
        conf.write_text(one("ConfigMap", "gpumon-config")["data"]["gpumon.toml"])
        port = _free_port()
        # The file as the pod reads it; only what exists in the pod and not here is replaced by
        # flags: the host's /proc mount, the host's socket directory, the pod's address.
        cmd = [
            str(binary), "--config", str(conf), "daemon",
            "--procfs", "/proc",
            "--socket", str(pathlib.Path(tmp) / "ingest.sock"),
            "--listen", f"127.0.0.1:{port}",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
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
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=15)
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
