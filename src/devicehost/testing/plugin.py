"""A pytest plugin for testing a backend against the real host and the kubelet stand-in.

pytest loads it wherever ``devicehost[testing]`` is installed (a ``pytest11`` entry point named
``devicehost.testing.plugin``, so ``-p devicehost.testing.plugin`` and ``pytest_plugins`` naming
it still work, and ``-p no:devicehost.testing.plugin`` turns it off). Loading it costs nothing:
the host, the stand-in and gRPC are imported only when a test uses one of its fixtures.

Options (each also an ini key, underscores instead of dashes):

``--devicehost-backend NAME``
    the installed backend (entry-point name) the ``host`` fixture and the conformance suite use.
``--devicehost-settings FILE``
    a YAML mapping handed to that backend's ``devicehost_configure``.
``--devicehost-reload-settings FILE``
    the settings the conformance suite's reload check reconfigures the backend with (default:
    the ``--devicehost-settings`` ones again).
``--devicehost-dra``
    also run the conformance suite's DRA rules (``dra-*``): the backend served through Dynamic
    Resource Allocation. Without it those checks are deselected (ini: ``devicehost_dra = true``).
``--devicehost-driver-name [RESOURCE=]DRIVER``
    the DRA driver name the operator will configure (the host's ``dra_drivers``): the DRA rules
    run under it. A bare ``DRIVER`` names the driver of every resource; repeatable (ini:
    ``devicehost_driver_name``, one a line).
``--devicehost-config FILE``
    the host config file the operator will deploy: the DRA rules run under its ``dra_drivers``
    (``--devicehost-driver-name RESOURCE=DRIVER`` wins for that resource; ini: ``devicehost_config``,
    relative to the rootdir).

Fixtures: ``devicehost_backend_name``, ``devicehost_settings``, ``devicehost_reload_settings``,
``devicehost_dra`` (whether ``--devicehost-dra`` was given), ``devicehost_driver_names``
(``--devicehost-driver-name`` as resource -> driver, ``""`` for a bare one),
``devicehost_cdi_dir`` (a temporary CDI spec dir, :mod:`devicehost.cdi`'s default while the test
runs), ``kubelet`` (a started :class:`KubeletStandIn`), ``start_host`` (a factory:
``await start_host(backends, **config)``) and ``host`` (the selected backend with its settings,
served to ``kubelet``). Hosts the kit starts write CDI specs to ``devicehost_cdi_dir``, never to
the machine's ``/var/run/cdi`` or ``/etc/cdi``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
import pytest_asyncio

if TYPE_CHECKING:
    from devicehost.host.daemon import Host
    from devicehost.standin import KubeletStandIn

BACKEND_OPTION = "devicehost_backend"
SETTINGS_OPTION = "devicehost_settings"
RELOAD_SETTINGS_OPTION = "devicehost_reload_settings"
DRA_OPTION = "devicehost_dra"
DRIVER_OPTION = "devicehost_driver_name"
HOST_CONFIG_OPTION = "devicehost_config"
DRA_MARKER = "devicehost_dra"
"""Marks a check that runs only with ``--devicehost-dra``."""
TEST_HOOK_TIMEOUT = 5.0
DESELECTED = pytest.StashKey[list[str]]()
"""The DRA checks deselected in this session (no ``--devicehost-dra``), by test name."""


class StartHost(Protocol):
    """The ``start_host`` fixture: start a host serving into the ``kubelet`` fixture's dir."""

    def __call__(
        self, backends: Mapping[str, object] | Sequence[str] | None = None, /, **config: Any
    ) -> Awaitable[Host]: ...


CONFORMANCE_MODULE = Path(__file__).with_name("conformance.py")
CONFORMANCE_NODE_PATH = "devicehost/testing/conformance.py"
"""How reports name the conformance suite when it lies outside the rootdir (installed)."""


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Give the conformance suite a path in node IDs when it lies outside the rootdir.

    Collected with ``--pyargs`` from outside the rootdir, pytest names a module relative to
    itself, an empty path, and failure lines read ``FAILED ::test_...``.
    """
    if module_path.resolve() != CONFORMANCE_MODULE.resolve():
        return None
    if module_path.is_relative_to(parent.config.rootpath):
        return None
    module: pytest.Module = pytest.Module.from_parent(parent, path=module_path, nodeid=CONFORMANCE_NODE_PATH)
    return module


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("devicehost", "devicehost backend testing")
    group.addoption(
        "--devicehost-backend",
        dest=BACKEND_OPTION,
        metavar="NAME",
        help="installed backend (devicehost.backends entry-point name) to test",
    )
    group.addoption(
        "--devicehost-settings",
        dest=SETTINGS_OPTION,
        metavar="FILE",
        help="YAML settings handed to the backend's devicehost_configure",
    )
    group.addoption(
        "--devicehost-reload-settings",
        dest=RELOAD_SETTINGS_OPTION,
        metavar="FILE",
        help="YAML settings the reload check reconfigures the backend with (default: the same again)",
    )
    group.addoption(
        "--devicehost-dra",
        dest=DRA_OPTION,
        action="store_true",
        help="also run the conformance suite's DRA rules (the backend served through DRA)",
    )
    group.addoption(
        "--devicehost-driver-name",
        dest=DRIVER_OPTION,
        action="append",
        default=[],
        metavar="[RESOURCE=]DRIVER",
        help="the DRA driver name the operator configures (dra_drivers); the DRA rules run under it",
    )
    group.addoption(
        "--devicehost-config",
        dest=HOST_CONFIG_OPTION,
        metavar="FILE",
        help="the host config file the operator deploys: the DRA rules run under its dra_drivers",
    )
    parser.addini(BACKEND_OPTION, "installed backend to test (as --devicehost-backend)")
    parser.addini(HOST_CONFIG_OPTION, "the operator's host config file (as --devicehost-config)")
    parser.addini(
        DRIVER_OPTION, "DRA driver names, one a line (as --devicehost-driver-name)", type="linelist"
    )
    parser.addini(SETTINGS_OPTION, "YAML settings file of that backend (as --devicehost-settings)")
    parser.addini(
        RELOAD_SETTINGS_OPTION, "YAML settings for the reload check (as --devicehost-reload-settings)"
    )
    parser.addini(
        DRA_OPTION, "run the DRA conformance rules (as --devicehost-dra)", type="bool", default=False
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{DRA_MARKER}: a DRA conformance check, run with --devicehost-dra")


def dra_selected(config: pytest.Config) -> bool:
    """Whether ``--devicehost-dra`` (or the ini key) asks for the DRA checks."""
    return bool(config.getoption(DRA_OPTION) or config.getini(DRA_OPTION))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the DRA checks unless they were asked for."""
    if dra_selected(config):
        return
    deselected = [item for item in items if item.get_closest_marker(DRA_MARKER) is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker(DRA_MARKER) is None]
        config.stash[DESELECTED] = [item.name for item in deselected if "conformance.py::" in item.nodeid]


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name every conformance rule that did not run, and why: skipped by the suite, or not
    selected (the DRA rules without ``--devicehost-dra``)."""
    skipped = [
        (r.nodeid.rpartition("::")[2].split("[")[0], _skip_reason(r))
        for r in terminalreporter.stats.get("skipped", ())
        if isinstance(r, pytest.TestReport) and "conformance.py::" in r.nodeid
    ]
    skipped += [(name, "not run: pass --devicehost-dra") for name in config.stash.get(DESELECTED, [])]
    header = pytest_report_header(config)
    if header and dra_selected(config):
        terminalreporter.write_line(header.replace("DRA drivers", "DRA rules ran under the driver names"))
    if not skipped:
        return
    from devicehost.testing.conformance_support import CHECKS

    terminalreporter.write_sep("-", "devicehost conformance: rules not checked, and why")
    for test, reason in skipped:
        terminalreporter.write_line(f"[{CHECKS.get(test, '?')}] {test}: {reason}")


def _option(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name) or config.getini(name)
    return str(value) if value else None


def selected_backend(config: pytest.Config) -> str:
    """The entry-point name given with ``--devicehost-backend`` (or the ini key)."""
    name = _option(config, BACKEND_OPTION)
    if name is None:
        pytest.fail("no backend selected: pass --devicehost-backend NAME", pytrace=False)
    return name


def selected_settings(config: pytest.Config, option: str = SETTINGS_OPTION) -> dict[str, Any]:
    """The settings in ``--devicehost-settings FILE`` (ini: relative to the rootdir); empty without."""
    given = config.getoption(option)
    path = Path(given) if given else None
    if path is None and config.getini(option):
        path = config.rootpath / str(config.getini(option))
    if path is None:
        return {}
    import yaml

    try:
        settings = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        pytest.fail(f"cannot read devicehost settings {path}: {exc}", pytrace=False)
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        pytest.fail(f"devicehost settings {path} must hold a mapping", pytrace=False)
    return settings


@pytest.fixture
def devicehost_backend_name(pytestconfig: pytest.Config) -> str:
    """The backend under test: ``--devicehost-backend NAME``."""
    return selected_backend(pytestconfig)


@pytest.fixture
def devicehost_settings(pytestconfig: pytest.Config) -> dict[str, Any]:
    """Its settings: ``--devicehost-settings FILE``, empty without one."""
    return selected_settings(pytestconfig)


@pytest.fixture
def devicehost_reload_settings(
    pytestconfig: pytest.Config, devicehost_settings: dict[str, Any]
) -> dict[str, Any]:
    """The reload check's settings: ``--devicehost-reload-settings FILE``, else the same again."""
    if _option(pytestconfig, RELOAD_SETTINGS_OPTION) is None:
        return devicehost_settings
    return selected_settings(pytestconfig, RELOAD_SETTINGS_OPTION)


@pytest.fixture
def devicehost_dra(pytestconfig: pytest.Config) -> bool:
    """Whether the DRA checks were asked for: ``--devicehost-dra``."""
    return dra_selected(pytestconfig)


def configured_drivers(config: pytest.Config) -> dict[str, str]:
    """The ``dra_drivers`` of the host config file ``--devicehost-config`` names (none without)."""
    given = config.getoption(HOST_CONFIG_OPTION)
    path = Path(given) if given else None
    if path is None and config.getini(HOST_CONFIG_OPTION):
        path = config.rootpath / str(config.getini(HOST_CONFIG_OPTION))
    if path is None:
        return {}
    import yaml

    try:
        host_config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        pytest.fail(f"cannot read the host config {path}: {exc}", pytrace=False)
    drivers = host_config.get("dra_drivers", {}) if isinstance(host_config, dict) else None
    if not isinstance(drivers, dict) or not all(isinstance(v, str) for v in drivers.values()):
        pytest.fail(f"{path}: dra_drivers must map resource names to driver names", pytrace=False)
    return {str(resource): driver for resource, driver in drivers.items()}


def selected_driver_names(config: pytest.Config) -> dict[str, str]:
    """``--devicehost-config``'s ``dra_drivers``, then ``--devicehost-driver-name`` (or the ini
    keys), as resource -> driver; ``""``: every resource."""
    given = config.getoption(DRIVER_OPTION) or config.getini(DRIVER_OPTION)
    named = configured_drivers(config)
    for word in given:
        resource, _, driver = str(word).rpartition("=")
        if not driver:
            pytest.fail(
                f"--devicehost-driver-name {word!r}: expected DRIVER or RESOURCE=DRIVER", pytrace=False
            )
        named[resource] = driver
    return named


def pytest_report_header(config: pytest.Config) -> str | None:
    named = selected_driver_names(config)
    if not named:
        return None
    return "devicehost DRA drivers: " + ", ".join(f"{r or '(every resource)'}={d}" for r, d in named.items())


@pytest.fixture
def devicehost_driver_names(pytestconfig: pytest.Config) -> dict[str, str]:
    """The DRA driver names the operator configures: ``--devicehost-driver-name``."""
    return selected_driver_names(pytestconfig)


@pytest.fixture
def devicehost_dir() -> Iterator[Path]:
    """A short temp dir under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def devicehost_cdi_dir(devicehost_dir: Path) -> Iterator[Path]:
    """A temporary CDI spec dir, :mod:`devicehost.cdi`'s default until the test ends."""
    from devicehost import cdi

    path = devicehost_dir / "cdi"
    path.mkdir()
    previous = cdi.default_dir()
    cdi.set_default_dir(path)
    yield path
    cdi.set_default_dir(previous)


@pytest_asyncio.fixture
async def kubelet(devicehost_dir: Path) -> AsyncIterator[KubeletStandIn]:
    """A started kubelet stand-in serving ``kubelet.sock`` in a fresh device-plugins dir, and
    pod-resources beside it, where a host :func:`~devicehost.testing.host.running_host` starts
    follows it (the pods of :meth:`~devicehost.standin.KubeletStandIn.allocate` hold their devices
    until :meth:`~devicehost.standin.KubeletStandIn.release_pod`)."""
    from devicehost.standin import KubeletStandIn
    from devicehost.testing.host import beside_kubelet

    plugins = devicehost_dir / "device-plugins"
    async with KubeletStandIn(plugins, pod_resources_socket=beside_kubelet(plugins)) as stand_in:
        yield stand_in


@pytest_asyncio.fixture
async def start_host(
    kubelet: KubeletStandIn, pytestconfig: pytest.Config, devicehost_cdi_dir: Path
) -> AsyncIterator[StartHost]:
    """Start real hosts serving into the ``kubelet`` fixture's dir; all stopped at teardown.

    ``backends`` defaults to the selected backend (``--devicehost-backend``), and ``config``'s
    ``backends`` to its settings; ``hook_timeout`` defaults to 5 s and ``cdi_dir`` to
    ``devicehost_cdi_dir``.
    """
    from devicehost.testing.host import running_host

    async with contextlib.AsyncExitStack() as stack:

        async def start(
            backends: Mapping[str, object] | Sequence[str] | None = None, /, **config: Any
        ) -> Host:
            if backends is None:
                name = selected_backend(pytestconfig)
                backends = [name]
                config.setdefault("backends", {name: selected_settings(pytestconfig)})
            config.setdefault("hook_timeout", TEST_HOOK_TIMEOUT)
            config.setdefault("cdi_dir", devicehost_cdi_dir)
            return await stack.enter_async_context(
                running_host(kubelet.device_plugins_dir, backends, **config)
            )

        yield start


@pytest_asyncio.fixture
async def host(start_host: StartHost) -> Host:
    """The selected backend, with its settings, served by a real host to ``kubelet``."""
    return await start_host()
