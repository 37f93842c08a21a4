"""The backend conformance suite: run it against an installed backend with one command::

    pytest --pyargs devicehost.testing.conformance \\
        --devicehost-backend NAME [--devicehost-settings settings.yaml] [--devicehost-dra]

Each check is one test; a failure starts with the rule it broke, ``[rule-id]``, listed in
:data:`devicehost.testing.conformance_support.RULES`. Checks marked "direct" call the backend's
hooks in this thread; "wire" checks run the real host against the kubelet stand-in. Both
write CDI specs to the kit's temporary dir (the ``devicehost_cdi_dir`` fixture), never to the
machine's. When ``devicehost_start`` fails, "start-hook" reports it once, with the hook's own
exception, and the wire checks are skipped rather than each timing out. The ``dra-*`` checks
(marked ``devicehost_dra``) run only with ``--devicehost-dra``: the backend served through DRA
(:mod:`devicehost.testing.conformance_dra`): ``dra-slices``, ``dra-prepare``, ``dra-unprepare``,
``dra-health``, and for claims as real drivers get them ``dra-config`` (a configuration the
backend's claim config model takes, from its JSON schema ``examples``, reaches the hook as an
instance of it), ``dra-config-refused`` (one it refuses fails that claim alone), ``dra-admin-access``
(an admin-access claim shares a device a normal claim holds), ``dra-subrequest`` (a prioritized
list's ``request/subrequest``); for a backend with a device that allows multiple allocations,
``dra-shares`` (two shares of it prepared, each with its share ID, and released apart), for one
with counter sets ``dra-counters`` (every partition fits its set, the sets are published, a
partition is prepared; its check of the declared counters, ``test_counters_are_declared_and_fit``,
runs without ``--devicehost-dra`` too), ``dra-config-used`` (two examples the model reads as
different give a container different edits), ``dra-release-scope`` (unpreparing one claim leaves
another on the same hardware as it was), and for a
backend with ``devicehost_device_status``, ``dra-device-status`` (it answers for its devices, and a
claim of a device with binding conditions becomes bindable). A backend whose resources all declare
``serve_through="dra"``
skips the device plugin wire checks. The DRA checks run under the driver names
``--devicehost-driver-name`` gives (the operator's ``dra_drivers``). A check that sets a device's
health makes it Healthy again on the way out, passed or failed; the plugin's summary names every
check skipped or deselected, with its rule and why (:data:`~devicehost.testing.conformance_support.CHECKS`).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pluggy
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from devicehost import quantity
from devicehost.hookspecs import REQUIRED_HOOKS, rules
from devicehost.hookspecs.types import ClaimRequest, Health, PreferredAllocationRequest, Resource
from devicehost.host.backends.backend import SettingsRefused, checked_settings, hook_implementations
from devicehost.host.backends.config_examples import INERT_KEY, declared_inert
from devicehost.host.backends.loader import UnknownBackendError
from devicehost.host.config import HostConfig
from devicehost.host.daemon import Host
from devicehost.host.inventory import DEVICE_PLUGIN
from devicehost.host.state import ResourceState
from devicehost.standin import AdmissionError, EventKind, KubeletStandIn, ResourceView
from devicehost.testing.conformance_dra import (
    REQUEST,
    SUBREQUEST,
    UNKNOWN_KEY,
    DraRun,
    answer_problems,
    config_problem,
    device_id,
    dra_run,
    published_counter_sets,
    received_problem,
    refused_config,
    sample_configs,
    slice_problems,
)
from devicehost.testing.conformance_support import (
    HEALTH_HOOK,
    UNKNOWN_ID,
    DirectBackend,
    NullNotifier,
    broken,
    cdi_resolution,
    fault_cleared,
    health_toggle,
    healthy_ids,
    held_together,
    leaks_after,
    load_plugin,
    servable,
    start_problem,
    undefined_cdi_names,
)
from devicehost.testing.host import BackendLoadError, load_named, running_host
from devicehost.testing.plugin import DRA_MARKER, StartHost

WAIT = 5.0
HEALTH_POLL = 0.05


@pytest.fixture
def plugin(devicehost_backend_name: str) -> object:
    """A fresh backend object, loaded from its entry point by the host's own loader."""
    return load_plugin(devicehost_backend_name)


@pytest.fixture
def direct(
    devicehost_backend_name: str,
    plugin: object,
    devicehost_settings: dict[str, Any],
    devicehost_cdi_dir: Path,
) -> DirectBackend:
    """The backend registered with pluggy and configured with the settings given (CDI: the kit's dir)."""
    try:
        backend = DirectBackend(devicehost_backend_name, plugin)
    except pluggy.PluginValidationError as exc:
        broken("hook-specs", str(exc))
    if backend.implements("devicehost_configure"):
        try:
            backend.hook.devicehost_configure(settings=modelled(backend, devicehost_settings, "settings"))
        except Exception as exc:
            broken("settings", f"devicehost_configure raised {type(exc).__name__}: {exc}")
    return backend


def modelled(direct: DirectBackend, settings: dict[str, Any], rule: str) -> Mapping[str, Any] | BaseModel:
    """``settings`` as the host hands them to devicehost_configure: an instance of the backend's
    settings model when it declares one, else as given; ``rule`` broken when the model refuses them."""
    if not direct.implements("devicehost_settings_model"):
        return settings
    model = _call(rule, "devicehost_settings_model", direct.hook.devicehost_settings_model)
    try:
        return checked_settings(direct.name, model, settings)
    except SettingsRefused as exc:
        broken(rule, str(exc))


@pytest.fixture
def discovered(direct: DirectBackend) -> list[Resource]:
    """One discovery's answer."""
    return direct.discover()


@pytest.fixture
def served(discovered: list[Resource]) -> list[Resource]:
    """The discovered resources the host serves; at least one of them has devices."""
    resources = servable(discovered)
    if not any(r.devices for r in resources):
        broken("has-devices", f"discovered {[r.name for r in discovered]}, none valid with devices")
    return resources


def _skip_unless_started(direct: DirectBackend, served: list[Resource]) -> None:
    """Skip a wire check when the start hook fails: test_start_hook_succeeds reports it, once."""
    problem = start_problem(direct, served)
    if problem:
        pytest.skip(f"[start-hook] broken (reported by test_start_hook_succeeds): {problem.splitlines()[0]}")


@pytest.fixture
def starts(direct: DirectBackend, served: list[Resource]) -> None:
    """Skips a device plugin wire check when the start hook fails, or when every resource declares
    itself served through DRA only (``serve_through="dra"``: the host serves none to the kubelet's
    device manager unless the operator says so)."""
    _skip_unless_started(direct, served)
    if all(r.serve_through == "dra" for r in served):
        pytest.skip(
            "every resource is declared served through DRA only: see the dra-* checks (--devicehost-dra)"
        )


async def _view(kubelet: KubeletStandIn, resource: Resource, rule: str) -> ResourceView:
    try:
        return await kubelet.wait_for_resource(resource.name, total=len(resource.devices), timeout=WAIT)
    except AssertionError as exc:
        broken(rule, f"{resource.name} did not reach the kubelet: {exc}")


async def _allocation_problems(
    kubelet: KubeletStandIn, host: Host, resources: Sequence[Resource], cdi_dir: Path, rule: str
) -> tuple[list[str], list[str]]:
    """Allocate every healthy device over the wire, each to a pod of its own: failed allocations,
    and undefined CDI names. Devices whose shared counters cannot all be held at once (a card and
    its partitions) go group after group (:func:`held_together`): the pods of one group end
    before the next, and the host lets their devices go once pod-resources no longer lists them."""
    failures, undefined, numbers = [], [], itertools.count()
    for resource in resources:
        view = await _view(kubelet, resource, rule)
        healthy = [d.id for d in view.devices if d.healthy]
        pods: dict[str, str] = {}
        for group in held_together(resource, healthy):
            await _end_pods(kubelet, host, resource, pods, len(healthy), rule)
            for device in group:
                pod = f"conformance-{rule}-{next(numbers)}"
                try:
                    result = await kubelet.allocate(resource.name, 1, [device], pod=pod)
                except grpc.aio.AioRpcError as exc:
                    failures.append(f"{resource.name} {device}: {exc.code().name} {exc.details()}")
                    continue
                except AdmissionError as exc:
                    failures.append(f"{resource.name} {device}: {exc}")
                    continue
                pods[pod] = device
                names = [c.name for c in result.response.container_responses[0].cdi_devices]
                undefined += [f"{resource.name} {device}: {p}" for p in undefined_cdi_names(names, cdi_dir)]
    return failures, undefined


async def _end_pods(
    kubelet: KubeletStandIn, host: Host, resource: Resource, pods: dict[str, str], healthy: int, rule: str
) -> None:
    """End ``pods`` (pod name -> its device; none: nothing to do) once the host has seen them in
    pod-resources, as a kubelet's pods run before they end; then wait until the host holds none
    of their devices, nothing is masked, and the kubelet has ``healthy`` Healthy devices again."""
    if not pods:
        return
    name, ids = resource.name, set(pods.values())
    if host.release is not None:
        seen = f"{name}: the host never saw the pods of {sorted(ids)} in pod-resources"
        await _until(lambda: _pods_seen(host, name, ids), rule, seen)
    for pod in pods:
        kubelet.release_pod(pod)
    pods.clear()
    held = f"{name}: the host still holds {sorted(ids)}, or masks devices, after their pods ended"
    await _until(lambda: _let_go(host, name, ids), rule, held)
    try:
        await kubelet.wait_for_resource(name, healthy=healthy, timeout=WAIT)
    except AssertionError as exc:
        broken(rule, f"{name}: the devices of ended pods never came back Healthy at the kubelet: {exc}")


def _state(host: Host, name: str) -> ResourceState | None:
    """The host's state of resource ``name`` (None: it does not serve it)."""
    return next((r for r in host.snapshot().resources if r.name == name), None)


def _pods_seen(host: Host, name: str, ids: set[str]) -> bool:
    """Whether pod-resources, as the host last read it, lists ``ids`` as held by containers."""
    state = _state(host, name)
    return state is None or ids <= set(state.holders)


def _let_go(host: Host, name: str, ids: set[str]) -> bool:
    """Whether the host holds none of ``ids`` for a container, releases nothing and masks nothing."""
    state = _state(host, name)
    if state is None:
        return True
    return not ids & set(state.holders) and not state.releasing and not state.masked.get(DEVICE_PLUGIN)


def _call(rule: str, what: str, hook: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return hook(**kwargs)
    except Exception as exc:
        broken(rule, f"{what} raised {type(exc).__name__}: {exc}")


# -- loading and the hook contract ---------------------------------------------------------


def test_loads_through_its_entry_point(devicehost_backend_name: str) -> None:
    try:
        backends = load_named([devicehost_backend_name], WAIT)
    except (BackendLoadError, UnknownBackendError) as exc:
        broken("entry-point", str(exc))
    assert [b.name for b in backends] == [devicehost_backend_name]
    for backend in backends:
        backend.close()


def test_hooks_are_synchronous(plugin: object) -> None:
    impls = hook_implementations(plugin)
    asynchronous = sorted(
        n for n, f in impls.items() if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
    )
    if asynchronous:
        broken("sync-hooks", f"async def: {', '.join(asynchronous)}")


def test_required_hooks_are_implemented(plugin: object) -> None:
    missing = [hook for hook in REQUIRED_HOOKS if hook not in hook_implementations(plugin)]
    if missing:
        broken("required-hooks", f"missing {', '.join(missing)}")


def test_hooks_match_their_specs(devicehost_backend_name: str, plugin: object) -> None:
    try:
        backend = DirectBackend(devicehost_backend_name, plugin)
    except pluggy.PluginValidationError as exc:
        broken("hook-specs", str(exc))
    assert backend.implements("devicehost_discover")


# -- discovery and health (direct) ---------------------------------------------------------


def test_resource_names_follow_the_kubelet_rule(discovered: list[Resource]) -> None:
    problems = [p for r in discovered if (p := rules.resource_name_problem(str(r.name)))]
    if problems:
        broken("resource-name", "; ".join(problems))


def test_device_ids_follow_the_kubelet_rule(discovered: list[Resource]) -> None:
    problems = [
        f"{r.name}: {p}" for r in discovered if (p := rules.device_ids_problem(d.id for d in r.devices))
    ]
    if problems:
        broken("device-id", "; ".join(problems))


def test_offers_devices(served: list[Resource]) -> None:
    assert any(r.devices for r in served)


def test_discovery_is_stable(direct: DirectBackend) -> None:
    first, second = direct.discover(), direct.discover()

    def ids(resources: list[Resource]) -> dict[str, list[str]]:
        return {r.name: sorted(d.id for d in r.devices) for r in resources}

    if ids(first) != ids(second):
        broken("stable-discovery", f"first {ids(first)}, then {ids(second)}")


def test_health_values_are_valid(direct: DirectBackend, discovered: list[Resource]) -> None:
    valid = {h.value for h in Health}
    for resource in discovered:
        bad = [f"{d.id}: {d.health!r}" for d in resource.devices if d.health not in valid]
        if bad:
            broken("health-values", f"{resource.name}: discovery gave invalid health ({', '.join(bad)})")
    if not direct.implements("devicehost_health"):
        return
    for resource in servable(discovered):
        answer = _call(
            "health-values",
            "devicehost_health",
            direct.hook.devicehost_health,
            resource=resource.name,
            devices=resource.devices,
        )
        if answer is None:
            continue
        if not isinstance(answer, dict):
            broken("health-values", f"{resource.name}: devicehost_health returned {answer!r:.300}")
        bad = [f"{k!r}: {v!r}" for k, v in answer.items() if not isinstance(v, str) or v not in valid]
        if bad:
            broken(
                "health-values",
                f"{resource.name}: devicehost_health gave invalid health ({', '.join(bad)});"
                " use devicehost.Health.HEALTHY or Health.UNHEALTHY",
            )
        strangers = sorted(set(answer) - {d.id for d in resource.devices})
        if strangers:
            broken("health-values", f"{resource.name}: devicehost_health named unknown devices {strangers}")


@pytest.mark.asyncio
async def test_health_goes_both_ways(
    devicehost_backend_name: str,
    devicehost_settings: dict[str, Any],
    plugin: object,
    direct: DirectBackend,
    served: list[Resource],
    starts: None,
    kubelet: KubeletStandIn,
    start_host: StartHost,
) -> None:
    toggle = health_toggle(direct)
    if toggle is None:
        pytest.skip(f"no {HEALTH_HOOK} on the backend: it does not claim health goes both ways")
    resource = next(r for r in served if healthy_ids(r))
    device, healthy = healthy_ids(resource)[0], len(healthy_ids(resource))
    name = devicehost_backend_name
    await start_host({name: plugin}, backends={name: devicehost_settings}, health_interval=HEALTH_POLL)
    await _view(kubelet, resource, "health-both-ways")

    def seen(health: Health) -> Callable[[], bool]:
        return lambda: any(d.id == device and d.health == health for d in kubelet.view(resource.name).devices)

    with fault_cleared(toggle, resource.name, device):
        for health in (Health.UNHEALTHY, Health.HEALTHY):
            await asyncio.to_thread(toggle, resource.name, device, health)
            what = f"{resource.name} device {device} never turned {health} at the kubelet"
            await _until(seen(health), "health-both-ways", what)
        # a fault may take several devices down together (a card and its partitions): all come back
        await _until(
            lambda: kubelet.view(resource.name).healthy == healthy,
            "health-both-ways",
            f"{resource.name}: {device} turned Healthy, but only {kubelet.view(resource.name).healthy}"
            f" of the {healthy} devices healthy before its fault are healthy again",
        )


# -- allocation ------------------------------------------------------------------------------


def test_allocation_answers_are_well_formed(direct: DirectBackend, served: list[Resource]) -> None:
    problems = []
    for resource in served:
        for device in healthy_ids(resource):
            what = f"devicehost_allocate({resource.name!r}, ({device!r},))"
            answer = _call(
                "allocation-answer",
                what,
                direct.hook.devicehost_allocate,
                resource=resource.name,
                device_ids=(device,),
                claim=None,
            )
            problem = rules.allocation_problem(answer)
            if problem:
                problems.append(f"{what} {problem}")
    if problems:
        broken("allocation-answer", "; ".join(problems[:5]))


def test_backend_refuses_unknown_ids(direct: DirectBackend, served: list[Resource]) -> None:
    for resource in served:
        assert UNKNOWN_ID not in {d.id for d in resource.devices}
        try:
            answer = direct.hook.devicehost_allocate(
                resource=resource.name, device_ids=(UNKNOWN_ID,), claim=None
            )
        except Exception:
            continue
        broken("unknown-ids-backend", f"{resource.name}: allocate of {UNKNOWN_ID!r} returned {answer!r:.200}")


@pytest.mark.asyncio
async def test_every_device_allocates_over_the_wire(
    served: list[Resource], starts: None, kubelet: KubeletStandIn, host: Host, devicehost_cdi_dir: Path
) -> None:
    failures, _ = await _allocation_problems(kubelet, host, served, devicehost_cdi_dir, "allocation-wire")
    if failures:
        broken("allocation-wire", "; ".join(failures[:5]))


@pytest.mark.asyncio
async def test_cdi_names_are_defined(
    served: list[Resource], starts: None, kubelet: KubeletStandIn, host: Host, devicehost_cdi_dir: Path
) -> None:
    _, undefined = await _allocation_problems(kubelet, host, served, devicehost_cdi_dir, "cdi-names")
    if undefined:
        broken("cdi-names", "; ".join(undefined[:5]))


@pytest.mark.asyncio
async def test_reload_keeps_allocations_working(
    devicehost_backend_name: str,
    devicehost_settings: dict[str, Any],
    devicehost_reload_settings: dict[str, Any],
    devicehost_cdi_dir: Path,
    direct: DirectBackend,
    served: list[Resource],
    starts: None,
    kubelet: KubeletStandIn,
    start_host: StartHost,
) -> None:
    name = devicehost_backend_name
    _call(
        "reload",
        "devicehost_configure with the reload settings",
        direct.hook.devicehost_configure,
        settings=modelled(direct, devicehost_reload_settings, "reload"),
    )
    expected = servable(direct.discover())
    reloaded: list[HostConfig] = []
    host = await start_host([name], backends={name: devicehost_settings}, reload_config=lambda: reloaded[0])
    for resource in served:
        await _view(kubelet, resource, "reload")
    reloaded.append(host.config.model_copy(update={"backends": {name: devicehost_reload_settings}}))
    before = host.discoveries
    host.request_reload()
    await _until(lambda: host.discoveries > before, "reload", "the host never rediscovered after the reload")
    failures, undefined = await _allocation_problems(kubelet, host, expected, devicehost_cdi_dir, "reload")
    if failures or undefined:
        broken("reload", "; ".join([*failures, *undefined][:5]))


async def _until(check: Callable[[], bool], rule: str, what: str) -> None:
    """Poll ``check`` every HEALTH_POLL seconds for up to WAIT seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        if loop.time() > deadline:
            broken(rule, what)
        await asyncio.sleep(HEALTH_POLL)


@pytest.mark.asyncio
async def test_kubelet_admission_succeeds(
    served: list[Resource], starts: None, kubelet: KubeletStandIn, host: Host
) -> None:
    """Two devices (or one) per resource, as the kubelet picks them: GetPreferredAllocation's
    answer when the resource offers it; else, for devices sharing counters, two the counters let
    the kubelet hold at once (the host refuses a card with its own partition)."""
    for resource in served:
        view = await _view(kubelet, resource, "admission")
        count = min(2, view.healthy)
        if count == 0:
            continue
        ids = None
        if resource.counter_sets and not view.options.get_preferred_allocation_available:
            groups = held_together(resource, [d.id for d in view.devices if d.healthy])
            ids = max(groups, key=len)[:count]
            count = len(ids)
        try:
            result = await kubelet.allocate(resource.name, count, ids)
        except (grpc.aio.AioRpcError, AdmissionError) as exc:
            broken("admission", f"{resource.name}, {count} devices: {exc}")
        assert len(result.device_ids) == count
        assert result.pre_started == view.options.pre_start_required


@pytest.mark.asyncio
async def test_host_refuses_unknown_ids(
    served: list[Resource], starts: None, kubelet: KubeletStandIn, host: Host
) -> None:
    for resource in served:
        view = await _view(kubelet, resource, "unknown-ids-host")
        for ids in ([UNKNOWN_ID], [*(d.id for d in view.devices[:1]), UNKNOWN_ID]):
            try:
                await kubelet.allocate_ids(resource.name, ids)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    broken("unknown-ids-host", f"{resource.name} {ids}: {exc.code().name} {exc.details()}")
                continue
            broken("unknown-ids-host", f"{resource.name}: Allocate of {ids} succeeded")


@pytest.fixture
def preferring(direct: DirectBackend, served: list[Resource]) -> list[Resource]:
    """The resources to ask for preferred allocations; skips backends without the hook."""
    if not direct.implements("devicehost_preferred_allocation"):
        pytest.skip("devicehost_preferred_allocation is not implemented")
    return [r for r in served if r.devices]


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_preferred_allocation_is_well_formed(
    direct: DirectBackend, preferring: list[Resource], data: st.DataObject
) -> None:
    resource = data.draw(st.sampled_from(preferring), label="resource")
    ids = [d.id for d in resource.devices]
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True), label="available")
    must_include = data.draw(st.lists(st.sampled_from(available), unique=True), label="must_include")
    size = data.draw(st.integers(max(1, len(must_include)), len(available)), label="size")
    request = PreferredAllocationRequest(tuple(available), tuple(must_include), size)
    what = f"devicehost_preferred_allocation({resource.name!r}, {request})"
    answer = _call(
        "preferred-allocation",
        what,
        direct.hook.devicehost_preferred_allocation,
        resource=resource.name,
        request=request,
    )
    problem = rules.preferred_allocation_problem(answer, available, must_include, size)
    if problem:
        broken("preferred-allocation", f"{what} {problem}")


# -- life cycle ------------------------------------------------------------------------------


def test_start_hook_succeeds(direct: DirectBackend, served: list[Resource]) -> None:
    problem = start_problem(direct, served)
    if problem:
        broken("start-hook", problem)


def test_start_and_stop_repeat_and_release(
    direct: DirectBackend, served: list[Resource], starts: None
) -> None:
    if not (direct.implements("devicehost_start") or direct.implements("devicehost_stop")):
        pytest.skip("neither devicehost_start nor devicehost_stop is implemented")
    notifier = NullNotifier()

    def run(step: str, hook: str) -> None:
        for resource in served:
            args: dict[str, Any] = {"resource": resource.name}
            if hook == "devicehost_start":
                args["notifier"] = notifier
            _call("start-stop", f"{resource.name}: {step}", getattr(direct.hook, hook), **args)

    def again() -> None:
        run("second stop", "devicehost_stop")
        run("start after stop", "devicehost_start")
        run("stop after the second start", "devicehost_stop")

    run("start", "devicehost_start")  # the first cycle may import or cache what later ones reuse
    run("stop", "devicehost_stop")
    leaks = leaks_after(again)
    if leaks:
        broken("start-stop", f"left behind after stop: {', '.join(leaks)}")


@pytest.mark.asyncio
async def test_survives_a_kubelet_restart(
    served: list[Resource], starts: None, kubelet: KubeletStandIn, host: Host
) -> None:
    for resource in served:
        await _view(kubelet, resource, "kubelet-restart")
    since = len(kubelet.events)
    await kubelet.restart()
    for resource in served:
        try:
            await kubelet.wait_for_event(EventKind.REGISTERED, resource.name, since=since, timeout=WAIT)
        except AssertionError as exc:
            broken("kubelet-restart", f"{resource.name} did not register again: {exc}")
        view = await _view(kubelet, resource, "kubelet-restart")
        assert view.registrations == 2


# -- device release --------------------------------------------------------------------------


async def _eventually(predicate: Callable[[], bool]) -> bool:
    """Whether ``predicate`` held within WAIT seconds (polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(HEALTH_POLL)
    return True


@pytest.mark.asyncio
async def test_released_devices_come_back(
    direct: DirectBackend,
    served: list[Resource],
    devicehost_dir: Path,
    devicehost_backend_name: str,
    devicehost_settings: dict[str, Any],
) -> None:
    """A pod's devices, released through pod-resources, reach the release hook and come back."""
    if not direct.implements("devicehost_release"):
        pytest.skip("devicehost_release is not implemented")
    resource = next(r for r in served if r.devices)
    what = f"{resource.name}: release of {resource.devices[0].id}"
    _call(
        "device-release",
        what,
        direct.hook.devicehost_release,
        resource=resource.name,
        device_ids=(resource.devices[0].id,),
        claim=None,
    )
    socket = devicehost_dir / "pod-resources" / "kubelet.sock"
    settings: dict[str, Any] = {
        "backends": {devicehost_backend_name: devicehost_settings},
        "pod_resources_socket": socket,
    }
    async with (
        KubeletStandIn(devicehost_dir / "release-dp", pod_resources_socket=socket) as kubelet,
        running_host(kubelet.device_plugins_dir, [devicehost_backend_name], **settings) as host,
    ):
        view = await _view(kubelet, resource, "device-release")
        try:
            booked = await kubelet.allocate(resource.name, 1, pod="conformance-release")
        except (grpc.aio.AioRpcError, AdmissionError) as exc:
            pytest.skip(f"nothing admitted to release ({exc}); see the admission rule")
        ids = list(booked.device_ids)
        tracker = host.release
        assert tracker is not None
        if not await _eventually(lambda: set(ids) <= set(tracker.holders.get(resource.name, {}))):
            broken("device-release", f"{resource.name}: the host never saw {ids} held (pod-resources)")
        kubelet.release_pod("conformance-release")
        if not await _eventually(lambda: tracker.releases[resource.name] >= 1):
            broken("device-release", f"{resource.name}: {ids} freed by the kubelet, never released")
        await tracker.wait_idle()
        failed = [
            b.hook_failures for b in host.snapshot().backends if b.hook_failures.get("devicehost_release")
        ]
        if failed:
            broken("device-release", f"{resource.name}: the release hook of {ids} failed: {failed}")
        try:
            await kubelet.wait_for_resource(resource.name, healthy=view.healthy, timeout=WAIT)
            await kubelet.allocate(resource.name, 1, ids, pod="conformance-again")
        except (AssertionError, grpc.aio.AioRpcError, AdmissionError) as exc:
            broken("device-release", f"{resource.name}: released {ids} not allocatable again: {exc}")


# -- Dynamic Resource Allocation (--devicehost-dra) -----------------------------------------

dra_check: pytest.MarkDecorator = getattr(pytest.mark, DRA_MARKER)


@pytest_asyncio.fixture
async def dra(
    devicehost_backend_name: str,
    devicehost_driver_names: dict[str, str],
    devicehost_settings: dict[str, Any],
    devicehost_dir: Path,
    devicehost_cdi_dir: Path,
    plugin: object,
    direct: DirectBackend,
    served: list[Resource],
) -> AsyncIterator[DraRun]:
    """The backend (the ``direct`` fixture's object) served through DRA only, with its settings,
    under the driver names the operator configures (``--devicehost-driver-name``)."""
    _skip_unless_started(direct, served)
    bare = devicehost_driver_names.get("")
    drivers = {r.name: bare for r in served} if bare else {}
    drivers |= {r: d for r, d in devicehost_driver_names.items() if r}
    async with dra_run(
        devicehost_dir,
        devicehost_backend_name,
        plugin,
        devicehost_settings,
        devicehost_cdi_dir,
        hook_timeout=WAIT,
        health_interval=HEALTH_POLL,
        dra_drivers=drivers,
    ) as run:
        yield run


def _with_healthy(served: list[Resource], rule: str) -> Resource:
    found = [r for r in served if healthy_ids(r)]
    if not found:
        pytest.skip(f"no resource has a healthy device to check {rule} with")
    return found[0]


@dra_check
@pytest.mark.asyncio
async def test_dra_publishes_every_resource(served: list[Resource], dra: DraRun) -> None:
    for resource in served:
        devices = await dra.published(resource, healthy_ids(resource), "dra-slices")
        problems = slice_problems(devices)
        if problems:
            broken("dra-slices", f"{resource.name}: {'; '.join(problems[:5])}")


@dra_check
@pytest.mark.asyncio
async def test_dra_claims_are_prepared(served: list[Resource], dra: DraRun) -> None:
    """Every published device alone, then two the scheduler could give one claim (their shared
    counters hold both: not a card with its own partition)."""
    for resource in served:
        names = {
            device_id(d): d["name"]
            for d in await dra.published(resource, healthy_ids(resource), "dra-prepare")
        }
        await dra.registered(resource, "dra-prepare")
        pair = [names[i] for i in max(held_together(resource, list(names)), key=len, default=[])[:2]]
        for devices in [*([name] for name in names.values()), *([pair] if len(pair) > 1 else [])]:
            claim = dra.claim(resource, devices)
            first = await dra.prepare(resource, claim, "dra-prepare")
            problems = answer_problems(dra, resource, devices, first)
            if problems:
                broken("dra-prepare", "; ".join(problems[:5]))
            again = await dra.prepare(resource, claim, "dra-prepare")
            if again != first:
                broken(
                    "dra-prepare", f"{resource.name} claim of {devices}: asked again, {again} after {first}"
                )
            await dra.unprepare(resource, claim, "dra-unprepare")


@dra_check
@pytest.mark.asyncio
async def test_dra_unprepare_releases(direct: DirectBackend, served: list[Resource], dra: DraRun) -> None:
    resource = _with_healthy(served, "dra-unprepare")
    device = (await dra.published(resource, healthy_ids(resource), "dra-unprepare"))[0]
    await dra.registered(resource, "dra-unprepare")
    claim = dra.claim(resource, [device["name"]])
    try:
        await dra.prepare(resource, claim, "dra-prepare")
    except pytest.fail.Exception as exc:
        pytest.skip(f"nothing prepared to unprepare; see the dra-prepare rule ({str(exc).splitlines()[0]})")
    await dra.unprepare(resource, claim, "dra-unprepare")
    released = (resource.name, (device_id(device),))
    if direct.implements("devicehost_release") and released not in dra.releases:
        broken("dra-unprepare", f"{resource.name}: unprepared {released[1]}, never released ({dra.releases})")
    if dra.prepared_claims(resource):
        broken("dra-unprepare", f"{resource.name}: the host still holds the unprepared claim")
    again = dra.claim(resource, [device["name"]])
    await dra.prepare(resource, again, "dra-unprepare")


async def _published_names(dra: DraRun, resource: Resource, rule: str, at_least: int = 1) -> list[str]:
    """The resource's published device names, once its driver is registered; skips with fewer
    than ``at_least``."""
    names = [d["name"] for d in await dra.published(resource, healthy_ids(resource), rule)]
    await dra.registered(resource, rule)
    if len(names) < at_least:
        pytest.skip(f"{resource.name} has {len(names)} healthy devices, {rule} needs {at_least}")
    return names


def _valid_configs(dra: DraRun, rule: str) -> list[dict[str, Any]]:
    """The configurations the backend takes (see conformance_dra.sample_configs); skips when the
    suite has none."""
    model = dra.config_model
    configs = sample_configs(model)
    if not configs:
        assert model is not None
        pytest.skip(
            f"no configuration for {model.__name__} to check {rule} with: give the model JSON schema"
            ' examples (model_config = ConfigDict(json_schema_extra={"examples": [...]}))'
        )
    for n, config in enumerate(configs):
        problem = config_problem(model, config)
        if problem:
            assert model is not None
            broken(rule, f"{model.__name__} refuses its own example {n} {config!r:.200}: {problem}")
    return configs


@dra_check
@pytest.mark.asyncio
async def test_dra_claim_config_reaches_the_hook(served: list[Resource], dra: DraRun) -> None:
    resource = _with_healthy(served, "dra-config")
    device = (await _published_names(dra, resource, "dra-config"))[0]
    for config in _valid_configs(dra, "dra-config"):
        claim = dra.claim(resource, [device], config=config)
        answer = await dra.prepare(resource, claim, "dra-config")
        problems = answer_problems(dra, resource, [device], answer)
        calls = dra.allocated(claim)
        if not calls:
            problems.append(f"claim with configuration {config!r:.200}: no allocate call")
        for _, _, request in calls:
            assert request is not None
            problem = received_problem(dra.config_model, config, request.config)
            if problem:
                problems.append(f"claim with configuration {config!r:.200}: {problem}")
        if problems:
            broken("dra-config", "; ".join(problems[:5]))
        await dra.unprepare(resource, claim, "dra-config")


@dra_check
@pytest.mark.asyncio
async def test_dra_refused_config_fails_its_claim_alone(served: list[Resource], dra: DraRun) -> None:
    if dra.config_model is None:
        pytest.skip("no devicehost_claim_config_model: the backend takes any configuration")
    rule = "dra-config-refused"
    resource = _with_healthy(served, rule)
    first, second = (await _published_names(dra, resource, rule, at_least=2))[:2]
    valid = _valid_configs(dra, rule)[0]
    bad = dra.claim(resource, [first], config=refused_config(valid))
    good = dra.claim(resource, [second], config=valid)
    error = await dra.prepare_all(resource, [bad, good])
    what = f"{resource.name}: a claim configured {refused_config(valid)!r:.200} and one configured {valid!r:.200}"
    if error is None:
        broken(rule, f"{what}: both prepared, the unknown key {UNKNOWN_KEY!r} was not refused")
    path = f"parameters.{UNKNOWN_KEY}"
    bad_failed = f"failed for claim {bad[0]}/{bad[2]}: "
    problems = []
    if bad_failed not in error or path not in error.split(bad_failed, 1)[1]:
        problems.append(f"the refused claim's error does not name {path!r}")
    if f"{good[0]}/{good[2]}" in error or "rpc error" in error:
        problems.append("the claim with a valid configuration failed with it")
    if dra.allocated(bad):
        problems.append("the allocate hook ran for the refused claim")
    if problems:
        broken(rule, f"{what}, prepared in one call: {'; '.join(problems)} (kubelet: {error})")
    answer = await dra.prepare(resource, good, rule)
    problems = answer_problems(dra, resource, [second], answer)
    if problems:
        broken(rule, "; ".join(problems[:5]))
    await dra.unprepare(resource, good, rule)
    await dra.unprepare(resource, bad, rule)


@dra_check
@pytest.mark.asyncio
async def test_dra_admin_access_shares_a_held_device(served: list[Resource], dra: DraRun) -> None:
    rule = "dra-admin-access"
    resource = _with_healthy(served, rule)
    device = (await _published_names(dra, resource, rule))[0]
    normal = dra.claim(resource, [device])
    await dra.prepare(resource, normal, "dra-prepare")
    admin = dra.claim(resource, [device], admin_access=True)
    try:
        answer = await dra.prepare(resource, admin, rule)
    except pytest.fail.Exception as exc:
        raise pytest.fail.Exception(
            f"{str(exc).splitlines()[0]} (an admin-access claim of {device}, which a normal claim holds)",
            pytrace=False,
        ) from None
    problems = answer_problems(dra, resource, [device], answer)
    if not any(c.admin_access for _, _, c in dra.allocated(admin) if c is not None):
        problems.append(
            f"{resource.name}: the allocate hook never got the admin-access claim with admin_access"
        )
    if problems:
        broken(rule, "; ".join(problems[:5]))
    await dra.unprepare(resource, admin, rule)
    if dra.prepared_claims(resource) != 1:
        broken(
            rule, f"{resource.name}: unpreparing the admin-access claim took the normal claim of {device} too"
        )
    await dra.unprepare(resource, normal, rule)


@dra_check
@pytest.mark.asyncio
async def test_dra_subrequest_claims_are_prepared(served: list[Resource], dra: DraRun) -> None:
    rule = "dra-subrequest"
    resource = _with_healthy(served, rule)
    device = (await _published_names(dra, resource, rule))[0]
    claim = dra.claim(resource, [device], request=SUBREQUEST)
    answer = await dra.prepare(resource, claim, rule)
    problems = answer_problems(dra, resource, [device], answer, request=SUBREQUEST)
    names = [c.name for _, _, c in dra.allocated(claim) if c is not None]
    if names != [SUBREQUEST]:
        problems.append(f"{resource.name}: the allocate hook got requests {names}, not [{SUBREQUEST!r}]")
    if problems:
        broken(rule, "; ".join(problems[:5]))
    await dra.unprepare(resource, claim, rule)


@dra_check
@pytest.mark.asyncio
async def test_dra_shares_are_prepared_and_released_apart(
    direct: DirectBackend, served: list[Resource], dra: DraRun
) -> None:
    rule = "dra-shares"
    shared = [
        (r, d.id)
        for r in served
        for d in r.devices
        if d.allow_multiple_allocations and d.health == Health.HEALTHY
    ]
    if not shared:
        pytest.skip("no healthy device allows multiple allocations: the backend does not share devices")
    resource, shared_id = shared[0]
    await _published_names(dra, resource, rule)
    device = next(d["name"] for d in dra.devices(resource) or () if device_id(d) == shared_id)
    claims = [dra.claim(resource, [device]) for _ in range(2)]
    problems = []
    for claim in claims:
        answer = await dra.prepare(resource, claim, rule)
        problems += answer_problems(dra, resource, [device], answer)
    given = [c.shares.get(shared_id) for claim in claims for _, _, c in dra.allocated(claim) if c is not None]
    wanted = [dra.cluster.claims[(claim[0], claim[2])].devices[0].share_id for claim in claims]
    if [s.id if s else None for s in given] != wanted:
        problems.append(f"{resource.name}: the allocate hook got shares {given}, not the claims' {wanted}")
    if problems:
        broken(rule, "; ".join(problems[:5]))
    await dra.unprepare(resource, claims[0], rule)
    if direct.implements("devicehost_release") and dra.released_shares != wanted[:1]:
        broken(
            rule,
            f"{resource.name}: unpreparing one share released {dra.released_shares}, not [{wanted[0]!r}]",
        )
    if dra.prepared_claims(resource) != 1:
        broken(rule, f"{resource.name}: unpreparing one share of {device} took the other claim too")
    await dra.unprepare(resource, claims[1], rule)


@dra_check
@pytest.mark.asyncio
async def test_dra_counters_fit_and_partitions_are_prepared(served: list[Resource], dra: DraRun) -> None:
    rule = "dra-counters"
    partitioned = [r for r in served if r.counter_sets]
    if not partitioned:
        pytest.skip("no resource declares counter_sets: the backend publishes no partitionable devices")
    for resource in partitioned:
        await _published_names(dra, resource, rule)
        counters = published_counter_sets(dra, resource)
        if counters != {name: set(sets) for name, sets in resource.counter_sets.items()}:
            broken(rule, f"{resource.name}: the pool's counters slice holds {counters}, not its counter sets")
        consuming = [d["name"] for d in dra.devices(resource) or () if d.get("consumesCounters")]
        if consuming:
            claim = dra.claim(resource, consuming[:1])
            problems = answer_problems(dra, resource, consuming[:1], await dra.prepare(resource, claim, rule))
            if problems:
                broken(rule, "; ".join(problems[:5]))
            await dra.unprepare(resource, claim, rule)


def test_counters_are_declared_and_fit(direct: DirectBackend) -> None:
    """dra-counters' check of what discovery declares: runs without ``--devicehost-dra`` too, as
    the operator may serve any resource through DRA."""
    rule = "dra-counters"
    answer = _call(rule, "devicehost_discover", direct.hook.devicehost_discover) or ()
    counted = [
        r
        for r in answer
        if isinstance(r, Resource) and (r.counter_sets or any(d.consumes for d in r.devices))
    ]
    if not counted:
        pytest.skip("no resource declares counter_sets: the backend publishes no partitionable devices")
    problems = [f"{r.name}: {p}" for r in counted if (p := rules.counter_sets_problem(r))]
    problems += [f"{r.name}: {p}" for r in counted for p in counters_problems(r)]
    if problems:
        broken(rule, "; ".join(problems[:5]))


def counters_problems(resource: Resource) -> list[str]:
    """Devices that consume more of a counter than its set holds: the scheduler can never place them."""
    problems = []
    for device in resource.devices:
        for name, counters in device.consumes.items():
            for counter, amount in counters.items():
                held = resource.counter_sets.get(name, {}).get(counter)
                if held is not None and quantity.parse(amount) > quantity.parse(held):
                    problems.append(
                        f"device {device.id!r} consumes {amount} of {name}/{counter}, which holds {held}:"
                        " it can never be allocated"
                    )
    return problems


@dra_check
@pytest.mark.asyncio
async def test_dra_claim_config_changes_what_a_container_gets(served: list[Resource], dra: DraRun) -> None:
    rule = "dra-config-used"
    model = dra.config_model
    if model is None:
        pytest.skip("no devicehost_claim_config_model: no configuration to tell apart")
    if declared_inert(model):
        pytest.skip(f"{model.__name__} declares its configuration inert ({INERT_KEY!r}: true)")
    configs = _valid_configs(dra, rule)
    differing = [c for c in configs[1:] if model.model_validate(c) != model.model_validate(configs[0])]
    if not differing:
        pytest.skip(
            f"{model.__name__} offers no two examples that differ once validated: name at least two"
            ' (json_schema_extra={"examples": [...]}), or declare it inert'
        )
    resource = _with_healthy(served, rule)
    device = (await _published_names(dra, resource, rule))[0]
    given = []
    for config in (configs[0], differing[0]):
        claim = dra.claim(resource, [device], config=config)
        answer = await dra.prepare(resource, claim, rule)
        edits, problems = cdi_resolution([i for d in answer for i in d.cdi_ids], dra.cdi_dir)
        if problems:
            broken("dra-prepare", f"{resource.name} claim of {device}: {'; '.join(problems[:5])}")
        given.append(edits)
        await dra.unprepare(resource, claim, rule)
    if given[0] == given[1]:
        broken(
            rule,
            f"{resource.name} {device}: claims configured {configs[0]!r:.200} and {differing[0]!r:.200},"
            f" which {model.__name__} reads as different, give a container the same edits"
            f" {_edits_text(given[0])}",
        )


def _edits_text(edits: Mapping[str, Sequence[Any]]) -> str:
    return "{" + ", ".join(f"{k}: {v!r:.200}" for k, v in edits.items() if v) + "}"


def _fitting_pair(resource: Resource, names: Mapping[str, str]) -> tuple[str, str] | None:
    """Two published devices (slice names, by device ID in ``names``) drawing on one counter set
    whose consumption fits the set together: the scheduler may give them to two claims."""
    consuming = [d for d in resource.devices if d.id in names and d.consumes]
    for n, first in enumerate(consuming):
        for second in consuming[n + 1 :]:
            shared = set(first.consumes) & set(second.consumes)
            if shared and all(_fits(resource, name, first, second) for name in shared):
                return names[first.id], names[second.id]
    return None


def _fits(resource: Resource, counter_set: str, *devices: Any) -> bool:
    held = resource.counter_sets.get(counter_set, {})
    for counter, amount in held.items():
        taken = sum(quantity.parse(d.consumes[counter_set].get(counter, 0)) for d in devices)
        if taken > quantity.parse(amount):
            return False
    return True


async def _neighbours(dra: DraRun, resource: Resource, rule: str) -> list[tuple[str, str, str]]:
    """Pairs of the resource's published devices (slice names) on the same hardware, and how:
    two drawing on one counter set, two shares of one device; else two devices of the resource."""
    await _published_names(dra, resource, rule)
    names = {device_id(d): str(d["name"]) for d in dra.devices(resource) or ()}
    pairs = []
    pair = _fitting_pair(resource, names)
    if pair:
        pairs.append((*pair, "two devices drawing on one counter set"))
    shared = [names[d.id] for d in resource.devices if d.allow_multiple_allocations and d.id in names]
    if shared:
        pairs.append((shared[0], shared[0], "two shares of one device"))
    if not pairs and len(names) > 1:
        first, second = list(names.values())[:2]
        pairs.append((first, second, "two devices of one resource"))
    if not pairs:
        pytest.skip(f"{resource.name} publishes {len(names)} device, {rule} needs two claims")
    return pairs


async def _release_scope_problem(
    direct: DirectBackend, dra: DraRun, resource: Resource, pair: tuple[str, str, str]
) -> str | None:
    """Prepare a claim of each device of ``pair``, unprepare the first: what that did to the
    other ("": nothing; None: the two were not both prepared, nothing checked)."""
    rule, (first, second, how) = "dra-release-scope", pair
    going, staying = dra.claim(resource, [first]), dra.claim(resource, [second])
    try:
        await dra.prepare(resource, going, "dra-prepare")
        ids = [i for d in await dra.prepare(resource, staying, "dra-prepare") for i in d.cdi_ids]
    except pytest.fail.Exception:
        return None
    before, _ = cdi_resolution(ids, dra.cdi_dir)
    await dra.unprepare(resource, going, rule)
    what = f"{resource.name}: unpreparing the claim of {first} ({how}, the other {second})"
    after, problems = cdi_resolution(ids, dra.cdi_dir)
    if problems:
        return f"{what} took the other claim's CDI devices: {'; '.join(problems[:3])}"
    if after != before:
        return f"{what} changed what the other claim gives a container: {_edits_text(before)}, now {_edits_text(after)}"
    ids_by_name = {str(d["name"]): device_id(d) for d in dra.devices(resource) or ()}
    held = next(d for d in resource.devices if d.id == ids_by_name.get(second))
    if direct.implements("devicehost_health"):
        hook = direct.hook.devicehost_health
        health = _call(rule, "devicehost_health", hook, resource=resource.name, devices=(held,)) or {}
        if health.get(held.id, Health.HEALTHY) != Health.HEALTHY:
            return f"{what} left {held.id}, which the other claim holds, {health[held.id]}"
    await dra.unprepare(resource, staying, rule)
    return ""


@dra_check
@pytest.mark.asyncio
async def test_dra_release_leaves_other_holders_alone(
    direct: DirectBackend, served: list[Resource], dra: DraRun
) -> None:
    rule = "dra-release-scope"
    resource = _with_healthy(served, rule)
    pairs = await _neighbours(dra, resource, rule)
    checked = 0
    for pair in pairs:
        problem = await _release_scope_problem(direct, dra, resource, pair)
        if problem:
            broken(rule, problem)
        checked += problem is not None
    if not checked:
        tried = "; ".join(f"{how} ({first}, {second})" for first, second, how in pairs)
        pytest.skip(f"{tried}: not both prepared, see the dra-prepare and dra-shares rules")


@dra_check
@pytest.mark.asyncio
async def test_dra_device_status_answers_for_its_devices(
    direct: DirectBackend, served: list[Resource], dra: DraRun
) -> None:
    rule = "dra-device-status"
    if not direct.implements("devicehost_device_status"):
        pytest.skip("no devicehost_device_status: the backend writes nothing into claims' status")
    resource = _with_healthy(served, rule)
    published = await dra.published(resource, healthy_ids(resource), rule)
    await dra.registered(resource, rule)
    device = published[0]
    claim = dra.claim(resource, [device["name"]])
    if device.get("bindingConditions"):
        await dra.until(
            lambda run: run.cluster.bindable(claim[0], claim[2]),
            rule,
            lambda: (
                f"{resource.name} {device['name']}: binding conditions {device['bindingConditions']} not"
                f" all True in the claim's status after {WAIT:g}s ({dra.cluster.device_statuses(claim[0], claim[2])})"
            ),
        )
    await dra.prepare(resource, claim, rule)
    ids = (device_id(device),)
    for prepared in (False, True):
        asked = ClaimRequest(REQUEST, f"{claim[0]}/{claim[2]}", claim[1])
        answer = _call(
            rule,
            f"{resource.name}: devicehost_device_status",
            direct.hook.devicehost_device_status,
            resource=resource.name,
            device_ids=ids,
            claim=asked,
            prepared=prepared,
        )
        problem = rules.device_status_problem({} if answer is None else answer, ids)
        if problem:
            broken(rule, f"{resource.name} {ids[0]} (prepared={prepared}): {problem}")
    await dra.unprepare(resource, claim, rule)


@dra_check
@pytest.mark.asyncio
async def test_dra_unhealthy_devices_leave_the_slice(
    direct: DirectBackend, served: list[Resource], dra: DraRun
) -> None:
    toggle = health_toggle(direct)
    if toggle is None:
        pytest.skip(f"no {HEALTH_HOOK} on the backend: it does not claim health goes both ways")
    resource = _with_healthy(served, "dra-health")
    device = healthy_ids(resource)[0]
    await dra.published(resource, healthy_ids(resource), "dra-health")
    with fault_cleared(toggle, resource.name, device):
        for health in (Health.UNHEALTHY, Health.HEALTHY):
            await asyncio.to_thread(toggle, resource.name, device, health)
            await _published_while(dra, resource, device, health)


async def _published_while(dra: DraRun, resource: Resource, device: str, health: Health) -> None:
    """Wait until ``device`` is published exactly when it is ``health``, Healthy."""
    present = health == Health.HEALTHY

    def done(run: DraRun) -> bool:
        return (device in (run.published_ids(resource) or set())) == present

    def what() -> str:
        seen = "never published again" if present else "still published"
        return f"{resource.name} device {device} turned {health}, {seen} after {WAIT:g}s"

    await dra.until(done, "dra-health", what)
