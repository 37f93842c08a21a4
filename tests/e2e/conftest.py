"""Session fixtures of the end-to-end tests: one real cluster, and the wheels every image uses.

The cluster is the kit's (a dir outside this repository named by $DEVICEHOST_K8S_KIT): ``up.sh`` once
per session, ``down.sh`` at the end whatever happened, so no process, mount or pod is left.
Objects a test created are deleted before ``down.sh`` (the kit keeps etcd across runs).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8skit import KIT_ENV, ClusterDra, Kit, kit_dir

REPO = Path(__file__).resolve().parents[2]
GIZMO = REPO / "tests" / "backends" / "devicehost-gizmo"
KIT = pytest.StashKey[Kit]()
# Everything a test may leave behind, deleted at the start (an earlier run may have been killed)
# and at the end of the session.
LEFTOVERS = (
    ("-n", "kube-system", "delete", "daemonset", "devicehost", "--ignore-not-found", "--wait=true"),
    (
        "-n",
        "default",
        "delete",
        "pods",
        "-l",
        "devicehost-e2e",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    ),
)


def _delete_leftovers(kit: Kit) -> None:
    for args in LEFTOVERS:
        try:
            kit.kubectl(*args, timeout=120)
        except AssertionError:
            # A pod of a killed run whose claim's driver is gone can never be unprepared.
            kit.kubectl(*args, "--force", "--grace-period=0", timeout=120)
    kit.kubectl("-n", "default", "delete", "resourceclaims", "--all", "--wait=false")


@pytest.fixture
def cdi_in_tmp() -> None:
    """Not here (tests/support/cdi_guard.py): the cluster these tests drive runs on this machine,
    and the host they start writes the node's CDI dir, which its runtime reads: that is what they
    test. The kit's ``down.sh`` leaves the node as it found it."""


@pytest.fixture
def machine_cdi_dirs_untouched() -> None:
    """Not here either: the node's CDI dir is the cluster's, and these tests change it on purpose."""


@pytest.fixture(scope="session")
def kit(pytestconfig: pytest.Config) -> Iterator[Kit]:
    """The kit's cluster, up for the session; down (``down.sh``) after it, whatever happened."""
    root = kit_dir()
    if root is None:
        pytest.skip(f"no Kubernetes kit: set {KIT_ENV} to a cluster kit dir (with up.sh and down.sh)")
    if os.geteuid() != 0:
        pytest.skip("the k8s kit runs a cluster on this machine and needs root")
    kit = Kit(root)
    pytestconfig.stash[KIT] = kit
    try:
        kit.timed("cluster up (up.sh)", root / "up.sh", timeout=300)
        _delete_leftovers(kit)
        yield kit
        _delete_leftovers(kit)
    finally:
        kit.timed("cluster down (down.sh)", root / "down.sh", timeout=300)


@pytest.fixture(scope="session")
def dra_cluster(kit: Kit) -> ClusterDra:
    """The cluster's Kubernetes version and served resource.k8s.io versions; a version the tests
    do not know (outside 1.34 to 1.37) skips the tests that depend on it, saying which."""
    try:
        return kit.dra()
    except ValueError as exc:
        pytest.skip(f"the tests know what Kubernetes 1.34 to 1.37 do of DRA: {exc}")


@pytest.fixture(scope="session")
def wheelhouse(kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels of this checkout, the example backend, the gizmo backend, their dependencies and
    setuptools: everything an offline image build (PIP_NO_INDEX=1) needs, for the kit's Python."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip(
            "the kit's Python base is Debian's 3.11: run the e2e env on python3.11 for matching wheels"
        )
    wheels = tmp_path_factory.mktemp("wheels")
    kit.timed(
        "wheelhouse (pip wheel)",
        sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheels,
        REPO, REPO / "plugins" / "devicehost-example", GIZMO, "setuptools>=77",
        timeout=600,
    )  # fmt: skip
    return wheels


@pytest.fixture(scope="session")
def image_context(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout, as a vendor has it, with the wheelhouse as ``wheels/`` in it."""
    context = tmp_path_factory.mktemp("image") / "context"
    junk = shutil.ignore_patterns(
        ".git", ".venv", ".tox", ".venv-tox", "__pycache__", "*.egg-info", ".*_cache"
    )
    shutil.copytree(REPO, context, ignore=junk)
    shutil.copytree(wheelhouse, context / "wheels", dirs_exist_ok=True)
    return context


@pytest.fixture(scope="session")
def python_base(kit: Kit) -> str:
    """The kit's Debian Python base, in containerd (consumer pods) and buildah (image builds)."""
    kit.ensure_python_base()
    return "localhost/python-base:bookworm"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """What the session measured and saw: times of each step, and the kubelet's side of things."""
    kit = config.stash.get(KIT, None)
    if kit is None:
        return
    terminalreporter.section("e2e timings (s)")
    for what, seconds in kit.timings.items():
        terminalreporter.write_line(f"{seconds:7.1f}  {what}")
    if kit.notes:
        terminalreporter.section("e2e observations")
        for note in kit.notes:
            terminalreporter.write_line(note)
