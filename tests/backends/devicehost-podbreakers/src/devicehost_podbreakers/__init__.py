"""Backends that would break pods in ways only the kit's CDI and start checks see; see the README."""

from __future__ import annotations

import devicehost
from devicehost import ContainerAllocation, Device, Resource, cdi

KIND = "podbreakers.example.com/gpu"
IDS = ("g0", "g1", "g2")


def _refuse_unknown(device_ids: tuple[str, ...]) -> None:
    unknown = sorted(set(device_ids) - set(IDS))
    if unknown:
        raise ValueError(f"no such devices: {unknown}")


class UnresolvableCdiBackend:
    """Its spec defines g0 and g1; allocating g2 hands the runtime a name nothing defines."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource(KIND, tuple(Device(i) for i in IDS))]

    @devicehost.hookimpl
    def devicehost_start(self, resource: str) -> None:
        edits = cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(path="/dev/null")])
        cdi.write_spec(cdi.Spec(kind=resource, devices=[cdi.Device(i, edits) for i in IDS[:2]]))

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        cdi.remove_spec(resource)

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        _refuse_unknown(device_ids)
        return ContainerAllocation(cdi_devices=[cdi.qualified_name(resource, i) for i in device_ids])


class FailingStartBackend:
    """Discovers and allocates fine; its start hook always raises."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource("podbreakers.example.com/nostart", tuple(Device(i) for i in IDS))]

    @devicehost.hookimpl
    def devicehost_start(self, resource: str) -> None:
        raise OSError(f"cannot open the driver for {resource}: /dev/podbreakers missing")

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        _refuse_unknown(device_ids)
        return ContainerAllocation(envs={"PODBREAKERS": ",".join(device_ids)})
