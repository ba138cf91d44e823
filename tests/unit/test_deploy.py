"""deploy/: Kubernetes manifests against the Kubernetes schemas, the systemd unit through
systemd-analyze, and the container file's sources. No machine here runs a cluster or a
container engine, so these are the checks that can run offline."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
# The oldest and newest Kubernetes the installed schemas know, but none before 1.27, where
# gRPC probes went GA (the package ships a rolling window of versions).
K8S_VERSIONS = ("oldest", "latest")


def _resources():
    yaml = pytest.importorskip("yaml")
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(kind, name=None):
    found = [doc for _, doc in _resources() if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_manifests_exist():
    assert {p.name for p in MANIFESTS} >= {"namespace.yaml", "configmap.yaml", "secret.example.yaml",
                                           "daemonset.yaml", "service.yaml"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_kubernetes_schemas(version):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    from kubernetes_validate.utils import all_versions
    from packaging.version import Version
    known = [v for v in all_versions() if Version(v) >= Version("1.27")]
    version = known[0] if version == "oldest" else known[-1]
    for filename, doc in _resources():
        try:
            # strict: an unknown (misspelt) field fails instead of being ignored by the API server
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            where = ".".join(map(str, e.path))
            pytest.fail(f"{filename} {doc['kind']}/{doc['metadata']['name']} against {version}: {where}: {e.message}")


def test_manifests_agree_with_each_other_and_the_api():
    from minferd._proto import pb2

    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the probes ask the daemon ("") and the API by the name the proto gives it
    assert c["livenessProbe"]["grpc"] == {"port": 50051, "service": ""}
    assert c["readinessProbe"]["grpc"]["service"] == pb2.DESCRIPTOR.services_by_name["Minferd"].full_name
    cmd = " ".join(c["command"] + c["args"])
    assert "--listen 0.0.0.0:50051" in cmd and "--metrics-listen 0.0.0.0:9464" in cmd
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    token_file = re.search(r"--token-file (\S+)", cmd).group(1)
    assert token_file.startswith(mounts["token"]["mountPath"] + "/")
    assert mounts["models"]["readOnly"] is True and "--models-dir /models" in cmd
    volumes = {v["name"]: v for v in pod["volumes"]}
    _one("Secret", volumes["token"]["secret"]["secretName"])
    flags = _one("ConfigMap", c["envFrom"][0]["configMapRef"]["name"])
    assert "$MINFERD_FLAGS" in cmd and "MINFERD_FLAGS" in flags["data"]
    assert pod["terminationGracePeriodSeconds"] > 60  # longer than the daemon's drain
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9464"
    for _, doc in _resources():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "minferd"


def _systemd_analyze(*args, cwd):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed here")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_systemd_unit_verifies(tmp_path):
    unit = DEPLOY / "minferd.service"
    p = _systemd_analyze("verify", "--man=no", "--generators=no", str(unit), cwd=tmp_path)
    # The one finding expected off a real install: ExecStart's binary does not exist on this
    # machine. Parse errors ("file:line: Unknown key ...", "Failed to parse ...") and anything
    # else are reported as "path:line:" or name the unit, and fail.
    exec_start = re.search(r"^ExecStart=(\S+)", unit.read_text(), re.M).group(1)
    expected = f"minferd.service: Command {exec_start} is not executable: No such file or directory"
    findings = [line for line in (p.stdout + p.stderr).splitlines()
                if line.strip() and line.strip() != expected]
    assert not findings, "\n".join(findings)


def test_systemd_unit_is_hardened(tmp_path):
    # Exposure is scored 0 (locked down) to 10; the unit scores 2.0 while still reaching /dev/nvidia*.
    p = _systemd_analyze("security", "--offline=yes", "--threshold=30", "--no-pager",
                         str(DEPLOY / "minferd.service"), cwd=tmp_path)
    if "--offline" in p.stderr or "--threshold" in p.stderr:
        pytest.skip(f"systemd-analyze too old for an offline security review: {p.stderr.strip()}")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    text = (DEPLOY / "minferd.service").read_text()
    assert "PrivateDevices=yes" not in text  # would hide the GPU
    assert re.search(r"^DeviceAllow=char-nvidia-frontend rw", text, re.M)


def test_containerfile_copies_what_exists():
    # The image cannot be built here; at least every COPY source must be in the build context
    # (the repository root) and the install must be the README's, with the cuda12 extra.
    text = (DEPLOY / "Containerfile").read_text()
    copies = re.findall(r"^COPY\s+(.+)$", text, re.M)
    assert copies
    for line in copies:
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    assert re.search(r'pip install [^\n]*"/src\[cuda12\]"', text)
    assert re.search(r"^USER (?!root|0\b)", text, re.M), "the image must not run as root"
    assert re.search(r"^EXPOSE 50051 9464$", text, re.M)
