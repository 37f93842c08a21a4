"""The hooks a backend may implement.

A backend is whatever its ``devicehost.backends`` entry point names: a module or an object
with ``@devicehost.hookimpl`` functions. Each backend is called on its own: the host never
mixes two backends' answers. Every hook is synchronous and is called in a worker thread with
a timeout; an ``async def`` implementation is refused when the backend loads.

Only ``devicehost_discover`` and ``devicehost_allocate`` are required. An implementation may
take any subset of a hook's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from devicehost.hookspecs.types import (
    ClaimRequest,
    ContainerAllocation,
    Device,
    DeviceStatus,
    Health,
    HostFacts,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

PROJECT_NAME = "devicehost"
_hookspec = pluggy.HookspecMarker(PROJECT_NAME)

REQUIRED_HOOKS = ("devicehost_discover", "devicehost_allocate")
TEST_HOOKS = ("devicehost_conformance_set_health",)
"""Hooks only the test kit calls; the host never does."""


@_hookspec(firstresult=True)
def devicehost_settings_model() -> type[BaseModel] | None:
    """Return the pydantic model of this backend's settings (optional).

    Called once, when the backend loads. The host then validates ``backends.<name>`` with it
    before every ``devicehost_configure`` (and in ``devicehost config check``): a wrong type or an
    unknown key (also when the model does not forbid extra keys) is refused with its key path,
    and ``devicehost_configure`` receives the validated model instance instead of the mapping.
    """


@_hookspec(firstresult=True)
def devicehost_claim_config_model() -> type[BaseModel] | None:
    """DRA only: return the pydantic model of the opaque configuration claims give this backend (optional).

    Called once, when the backend loads. Before each allocate hook of a DRA claim, the host
    validates the request's configuration (a DeviceClass's or a claim's ``opaque.parameters`` for
    this driver) with it: a refusal fails that claim alone, naming the request and the key path,
    and the allocate hook receives the model instance as ``claim.config``. Without a model the
    parameters arrive as a mapping. Set ``extra="forbid"`` to refuse keys the model does not know.
    """


@_hookspec
def devicehost_host_facts(facts: HostFacts) -> None:
    """Receive what the host knows of the node: its name and the dirs the backend may write (optional).

    Called before the first other hook call (the settings' dry run included; the two model hooks
    are asked at load, before it) and again before the next hook call whenever a fact changed (a
    reload of ``cdi_dir``), so every hook sees the facts of the moment. Keep what you need of them; nothing else of the host reaches a
    backend (no environment variable, no module state).

    :param facts: the node's name and the host's ``cdi_dir`` (:class:`~devicehost.HostFacts`).
    """


@_hookspec
def devicehost_configure(settings: Mapping[str, Any] | BaseModel) -> None:
    """Receive this backend's settings, before the first discovery and again on every reload.

    Raise ``ValueError`` with a message naming the setting when they are invalid: the backend
    then keeps its previous settings (or, at start, is not loaded).

    :param settings: the mapping under ``backends.<name>`` in the host config file, empty when
        there is none; an instance of the backend's settings model when it declares one
        (``devicehost_settings_model``). It may be called as a dry run (``devicehost config
        check``, and ``devicehost run`` before it serves): keep no resources from it.
    """


@_hookspec(firstresult=True)
def devicehost_discover() -> Sequence[Resource] | None:
    """Return the resources this backend offers now, each with its devices.

    Called at start, at every rediscovery interval, on SIGHUP and when a notifier asks for it.
    A resource missing from the answer is withdrawn from the kubelet; a new one is served and
    registered. Stops at first non-None result.
    """


@_hookspec(firstresult=True)
def devicehost_health(resource: str, devices: tuple[Device, ...]) -> Mapping[str, Health] | None:
    """Return the current health of a resource's devices; called every health interval.

    Devices left out of the answer keep their health, so a backend may return only what
    changed. Health may go both ways: Unhealthy devices become allocatable again when a later
    answer says Healthy. Stops at first non-None result.

    :param resource: the extended resource name.
    :param devices: the devices as the host currently advertises them.
    """


@_hookspec
def devicehost_start(resource: str, notifier: ResourceNotifier) -> None:
    """Prepare a resource before it is served and registered with the kubelet.

    Keep ``notifier`` to push health or device-list changes from any thread (a watch thread
    on driver events, say) instead of waiting for the next poll.

    :param resource: the extended resource name.
    :param notifier: pushes changes for this resource to the host; see ResourceNotifier.
    """


@_hookspec
def devicehost_stop(resource: str) -> None:
    """Release what ``devicehost_start`` took, after the resource was withdrawn.

    Called once per started resource: when it leaves discovery, on reload, and on shutdown.

    :param resource: the extended resource name.
    """


@_hookspec(firstresult=True)
def devicehost_allocate(
    resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
) -> ContainerAllocation | None:
    """Return what one container needs to use the given devices.

    The host has checked that every ID belongs to the resource. Raise to fail the pod's
    admission; the exception's message reaches the kubelet. Stops at first non-None result.

    Through DRA it is called once per claim request with the devices allocated for it, and what
    it returns reaches every container that uses the request (as a CDI device of the claim).

    :param resource: the extended resource name.
    :param device_ids: the IDs the kubelet allocated to this container (through DRA: to the
        claim's request).
    :param claim: through DRA, the claim request with its configuration and admin access
        (:class:`~devicehost.ClaimRequest`); None through the device plugin API.
    """


@_hookspec(firstresult=True)
def devicehost_preferred_allocation(
    resource: str, request: PreferredAllocationRequest
) -> Sequence[str] | None:
    """Pick ``request.size`` device IDs for one container (topology-aware packing, say).

    Optional: implementing it makes the host advertise ``get_preferred_allocation_available``.
    The answer must hold exactly ``request.size`` distinct IDs from ``request.available``,
    including every one of ``request.must_include``. Stops at first non-None result.

    :param resource: the extended resource name.
    :param request: the kubelet's available, must-include and size.
    """


@_hookspec
def devicehost_pre_start_container(resource: str, device_ids: tuple[str, ...]) -> None:
    """Prepare devices right before a container that uses them starts (reset a GPU, say).

    Optional: implementing it makes the host advertise ``pre_start_required``. Raise to fail
    the container start.

    :param resource: the extended resource name.
    :param device_ids: the IDs allocated to the container.
    """


@_hookspec
def devicehost_release(resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None) -> None:
    """Scrub devices the kubelet no longer assigns to any running container (wipe memory, reset).

    Optional: the host learns of releases from the kubelet's pod-resources API and calls this
    once per device set a container held, never for devices the kubelet still assigns. The
    devices are advertised Unhealthy until it returns, then get their health back. Through DRA
    it is called when a claim is unprepared, for the claim's devices that no other prepared
    claim (an admin-access one, say) still takes, and once per request for the claim's shares
    of devices that allow multiple allocations (each share is released with its claim, whoever
    else takes the device).

    :param resource: the extended resource name.
    :param device_ids: the IDs one container held, now free; for shares, the shared devices.
    :param claim: for shares, the claim request whose shares go (:attr:`ClaimRequest.shares`:
        each device's share ID and what it took); None otherwise. Implementations may omit it.
    """


@_hookspec
def devicehost_restore(resource: str, device_ids: tuple[str, ...], claim: ClaimRequest) -> None:
    """DRA only: set up again what a claim prepared before this host started needs (optional).

    A node reboot loses hardware state and a host restart loses the backend's memory, but the
    kubelet still counts the claim as prepared and its containers start again with the CDI IDs
    they were given. So when the host starts and finds a prepared claim in its checkpoint, it
    writes the claim's CDI spec again, then calls this, before it registers the driver with the
    kubelet: once per claim, resource and request, with what the allocate hook was given then
    (the devices, the request's configuration checked by the model again, admin access, shares).
    Raise to refuse: that claim alone is unprepared (its devices released, its spec removed) and
    the reason logged (``claim not restored``); the kubelet's next prepare of it starts afresh.

    :param resource: the extended resource name.
    :param device_ids: the claim's devices of the resource and request.
    :param claim: the claim request, as for allocate.
    """


@_hookspec(firstresult=True)
def devicehost_device_status(
    resource: str, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
) -> Mapping[str, DeviceStatus] | None:
    """DRA only: the status of devices allocated to a claim, for the claim's ``status.devices`` (optional).

    Implementing it makes the host call it, and write what it answers into the claim's status:

    - before the pod binds, for a claim that got devices with ``binding_conditions`` (``prepared``
      False): again every second while any binding condition is not True and no binding failure
      condition is True, so answer at once with what holds now (``Attached`` False while attaching);
    - after the kubelet prepared the claim (``prepared`` True): conditions, ``data`` and
      ``network`` as the pod should see them (the interface and addresses a NIC got, say).

    Called once per claim, resource and request, like the allocate hook. Devices left out of the
    answer, and condition types left out of a device's status, keep what the claim shows. Stops
    at first non-None result.

    :param resource: the extended resource name.
    :param device_ids: the claim's devices of the resource and request.
    :param claim: the claim request, its configuration and admin access (as for allocate).
    :param prepared: whether the kubelet has prepared the claim (the pod is bound then).
    """


@_hookspec
def devicehost_conformance_set_health(resource: str, device_id: str, health: Health) -> None:
    """A test seam the host never calls: make one device turn ``health`` as a real fault would.

    Optional. Implementing it declares that the backend's health goes both ways: the
    conformance suite calls it to make a device Unhealthy and then Healthy again, and expects
    the kubelet to see both (through the notifier or ``devicehost_health``). Make it act the
    way a real fault and recovery would (inject an event into a fake driver, say).

    :param resource: the extended resource name.
    :param device_id: one of its devices.
    :param health: the health the device must turn.
    """
