"""A backend that breaks conformance rules on purpose; see this distribution's README."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, PreferredAllocationRequest, Resource

GOOD = "broken.example.com/good"
FLAKY = "broken.example.com/flaky"


class NonconformantBackend:
    """Loads and registers like any backend; answers wrongly in the ways its README lists."""

    def __init__(self) -> None:
        self._discoveries = itertools.count()
        self._notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self._never = threading.Event()

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        generation = next(self._discoveries)
        return [
            Resource(GOOD, (Device("g0"), Device("g1"), Device("g2"))),
            Resource("broken.example.com/bad name", (Device("b0"),)),
            Resource("broken.example.com/long", (Device("x" * 70),)),
            Resource(FLAKY, (Device(f"f{generation}"),)),
        ]

    @devicehost.hookimpl
    def devicehost_health(self, resource: str) -> Mapping[str, Health]:
        return {"not-a-device-of-" + resource: Health.HEALTHY}

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        self._notifiers[resource] = notifier
        threading.Thread(target=self._never.wait, name=f"leak-{resource}", daemon=True).start()

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        self._notifiers.pop(resource, None)

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(
            devices=[
                DeviceSpec(container_path=f"dev/{i}", host_path="/dev/null", permissions="rwx" if n else "rw")
                for n, i in enumerate(device_ids)
            ]
        )

    @devicehost.hookimpl
    def devicehost_release(self, device_ids: tuple[str, ...]) -> None:
        raise RuntimeError(f"cannot scrub {device_ids}")

    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: PreferredAllocationRequest) -> list[str]:
        return list(request.available[: request.size - 1])

    @devicehost.hookimpl
    def devicehost_conformance_set_health(self, resource: str, device_id: str, health: Health) -> None:
        """Turns devices Unhealthy; forgets to turn them Healthy again."""
        notifier = self._notifiers.get(resource)
        if notifier is not None and health == Health.UNHEALTHY:
            notifier.set_health({device_id: health})
