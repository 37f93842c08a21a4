"""The conformance suite's DRA run, for backends that opt in with ``--devicehost-dra``.

The backend is served through DRA only (``serve_through: {backend: dra}``) by the real host, with
an in-memory API server and scheduler (:class:`~devicehost.testing.cluster.ClusterStandIn`) and
the kubelet stand-in, whose plugin watcher takes the driver's registration from
``plugins_registry`` and prepares and unprepares claims over the wire. :func:`slice_problems`
checks a published ResourceSlice against what the API server accepts.

Claims may carry a request or ``request/subrequest`` name, an opaque configuration and admin
access. The configurations the suite prepares come from the backend's claim config model
(:func:`sample_configs`): the ``examples`` of its JSON schema
(``model_config = ConfigDict(json_schema_extra={"examples": [...]})``), else the least one the
suite can build from its required fields (a ``Literal``'s first value, an enum's first member,
nested models likewise, defaults left out); a configuration the model refuses is a valid one
with an unknown top-level key (:func:`refused_config`), which the host refuses for every model.
Every call of the backend's allocate and release (through the host's facade) is recorded.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from devicehost.hookspecs import rules
from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, Resource
from devicehost.host.backends.config_examples import config_examples
from devicehost.host.daemon import Host
from devicehost.host.dra import names
from devicehost.resourceapi import AllocatedDevice, ClaimAllocation, OpaqueConfig
from devicehost.standin import DraCallError, DraDevice, KubeletStandIn
from devicehost.standin.apiserver import share_of
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.conformance_support import broken, undefined_cdi_names
from devicehost.testing.host import running_host

NODE = "conformance-node"
NAMESPACE = "conformance"
REQUEST = "device"
SUBREQUEST = f"{REQUEST}/first"
"""A prioritized list's choice: subrequest ``first`` of request ``device``."""
UNKNOWN_KEY = "devicehostConformanceUnknown"
"""The key a refused configuration adds to a valid one (the host refuses unknown top-level keys)."""
MAPPING_CONFIG: Mapping[str, Any] = {"devicehostConformance": {"sample": [1, "two"]}}
"""The configuration prepared for a backend without a claim config model: any mapping will do."""
WAIT = 5.0
MAX_SLICE_DEVICES = 128
"""Devices one ResourceSlice may hold (``resource.k8s.io/v1``)."""
MAX_DEVICE_FIELDS = 32
"""Attributes and capacities together, per device."""
MAX_VALUE = 64
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

__all__ = [
    "NAMESPACE",
    "NODE",
    "REQUEST",
    "SUBREQUEST",
    "DraRun",
    "device_id",
    "dra_run",
    "sample_configs",
    "slice_problems",
]

ClaimRef = tuple[str, str, str]
Allocated = tuple[str, tuple[str, ...], ClaimRequest | None]
"""(resource, device IDs, claim) of one allocate call."""


def _qualified_name_problem(name: str) -> str | None:
    domain, _, identifier = name.rpartition("/")
    if domain and (len(domain) > 63 or not _SUBDOMAIN.fullmatch(domain)):
        return f"attribute {name!r}: {domain!r} is not a DNS subdomain"
    if len(identifier) > 32 or not _IDENTIFIER.fullmatch(identifier):
        return f"attribute {name!r}: not a C identifier of at most 32 characters"
    return None


def _value_problem(name: str, value: Mapping[str, Any]) -> str | None:
    if not isinstance(value, Mapping) or len(value) != 1:
        return f"attribute {name!r}: {value!r:.100} must hold exactly one of bool, int, string, version"
    ((kind, held),) = value.items()
    valid = {
        "bool": isinstance(held, bool),
        "int": isinstance(held, int) and not isinstance(held, bool),
        "string": isinstance(held, str) and len(held) <= MAX_VALUE,
        "version": isinstance(held, str) and len(held) <= MAX_VALUE,
    }
    if not valid.get(kind, False):
        return f"attribute {name!r}: {kind} {held!r:.100} is not a valid value (strings: at most {MAX_VALUE})"
    return None


def slice_problems(devices: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the API server would refuse in a slice's devices: names, attributes, counts."""
    problems = []
    if len(devices) > MAX_SLICE_DEVICES:
        problems.append(f"{len(devices)} devices in one slice, the API allows {MAX_SLICE_DEVICES}")
    seen: set[str] = set()
    for device in devices:
        name = str(device.get("name", ""))
        if len(name) > 63 or not _LABEL.fullmatch(name):
            problems.append(f"device name {name!r} is not a DNS label")
        if name in seen:
            problems.append(f"device name {name!r} appears twice")
        seen.add(name)
        attributes = device.get("attributes", {})
        if len(attributes) + len(device.get("capacity", {})) > MAX_DEVICE_FIELDS:
            problems.append(f"{name}: more than {MAX_DEVICE_FIELDS} attributes and capacities")
        for attribute, value in attributes.items():
            problem = _qualified_name_problem(attribute) or _value_problem(attribute, value)
            if problem:
                problems.append(f"{name}: {problem}")
    return problems


def device_id(device: Mapping[str, Any]) -> str:
    """The device ID the host published a slice's device for (its ``id`` attribute)."""
    return str(device.get("attributes", {}).get("id", {}).get("string", ""))


@dataclass
class DraRun:
    """One host serving the backend through DRA, its API server, and the kubelet."""

    backend: str
    host: Host
    cluster: ClusterStandIn
    kubelet: KubeletStandIn
    cdi_dir: Path
    releases: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """(resource, device IDs) of every release hook call that returned, in order."""
    released_shares: list[str] = field(default_factory=list)
    """The share IDs those calls released, in order."""
    allocations: list[Allocated] = field(default_factory=list)
    """Every allocate call, as it was made (before the hook ran), in order."""

    def driver(self, resource: Resource) -> str:
        return names.driver_name(resource.name, self.host.config.dra_drivers)

    def pool(self, resource: Resource) -> str:
        return names.pool_name(NODE, resource.name)

    def devices(self, resource: Resource) -> list[Mapping[str, Any]] | None:
        """The devices of the resource's slice now; ``None`` while it is not published."""
        body = self.cluster.stored.get(names.slice_name(NODE, self.driver(resource), resource.name))
        return None if body is None else list(body["spec"]["devices"])

    def published_ids(self, resource: Resource) -> set[str] | None:
        devices = self.devices(resource)
        return None if devices is None else {device_id(d) for d in devices}

    async def until(self, predicate: Callable[[DraRun], bool], rule: str, what: Callable[[], str]) -> None:
        """Wait up to WAIT seconds for ``predicate(self)``; break ``rule`` saying ``what()`` if never."""
        try:
            await self.cluster.wait(lambda _: predicate(self), WAIT)
        except TimeoutError:
            broken(rule, what())

    async def published(self, resource: Resource, ids: Sequence[str], rule: str) -> list[Mapping[str, Any]]:
        """The resource's slice devices once they are exactly ``ids``."""
        await self.until(
            lambda run: run.published_ids(resource) == set(ids),
            rule,
            lambda: (
                f"{resource.name}: published {_sorted(self.published_ids(resource))} after {WAIT:g}s,"
                f" not its healthy devices {sorted(ids)}"
            ),
        )
        return self.devices(resource) or []

    async def registered(self, resource: Resource, rule: str) -> str:
        """The resource's driver, once the kubelet has its registration."""
        driver = self.driver(resource)
        try:
            await self.kubelet.dra.wait_for_driver(driver, WAIT)
        except AssertionError as exc:
            broken(rule, f"{resource.name}: {exc}")
        return driver

    def claim(
        self,
        resource: Resource,
        devices: Sequence[str],
        *,
        request: str = REQUEST,
        config: Mapping[str, Any] | None = None,
        admin_access: bool = False,
    ) -> ClaimRef:
        """A claim the scheduler allocated ``devices`` (slice device names) of the resource's pool
        to, for ``request`` (``request/subrequest``: a prioritized list's choice), with ``config``
        for the driver and the request, admin access or not, and a new share of shared devices."""
        uid = str(uuid.uuid4())
        name = f"conformance-{uid[:8]}"
        driver, pool = self.driver(resource), self.pool(resource)
        published = {d["name"]: d for d in self.devices(resource) or ()}
        allocated = tuple(
            AllocatedDevice(request, driver, pool, device, admin_access, *share_of(published.get(device, {})))
            for device in devices
        )
        configs = () if config is None else (OpaqueConfig(driver, config, (request.partition("/")[0],)),)
        self.cluster.claims[(NAMESPACE, name)] = ClaimAllocation(uid, allocated, configs)
        return NAMESPACE, uid, name

    @property
    def config_model(self) -> type[BaseModel] | None:
        """The backend's claim config model, as the host loaded it (None: it declares none)."""
        return self.host.backends.loaded[self.backend].claim_config_model

    def allocated(self, claim: ClaimRef) -> list[Allocated]:
        """The allocate calls made for ``claim``."""
        return [a for a in self.allocations if a[2] is not None and a[2].uid == claim[1]]

    async def prepare_all(self, resource: Resource, claims: Sequence[ClaimRef]) -> str | None:
        """Prepare ``claims`` in one kubelet call: None when every one is prepared, else the
        kubelet's error (which names each claim that came back with an error, and why)."""
        try:
            await self.kubelet.dra.prepare(self.driver(resource), claims, timeout=WAIT)
        except DraCallError as exc:
            return str(exc)
        return None

    async def prepare(self, resource: Resource, claim: ClaimRef, rule: str) -> tuple[DraDevice, ...]:
        """The claim's devices as the driver prepared them; ``rule`` broken when it refuses."""
        try:
            answer = await self.kubelet.dra.prepare(self.driver(resource), [claim], timeout=WAIT)
        except DraCallError as exc:
            broken(rule, f"{resource.name}: {exc}")
        return answer[claim[1]]

    async def unprepare(self, resource: Resource, claim: ClaimRef, rule: str) -> None:
        """Unprepare the claim (``rule`` broken when refused); the scheduler then forgets it."""
        try:
            await self.kubelet.dra.unprepare(self.driver(resource), [claim], timeout=WAIT)
        except DraCallError as exc:
            broken(rule, f"{resource.name}: {exc}")
        self.cluster.claims.pop((claim[0], claim[2]), None)

    def prepared_claims(self, resource: Resource) -> int:
        """Claims the host holds prepared with the resource's devices (its state)."""
        states = [s for s in self.host.snapshot().resources if s.name == resource.name and s.dra is not None]
        return sum(s.dra.prepared_claims for s in states if s.dra is not None)

    def _record_releases(self) -> None:
        """Note every release call of the host's backend that returns (the hook ran, or is absent)."""
        backend = self.host.backends.loaded[self.backend]
        release = backend.release

        async def recording(
            resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None = None
        ) -> None:
            await release(resource, device_ids, claim)
            self.releases.append((resource, tuple(device_ids)))
            if claim is not None:
                self.released_shares.extend(share.id for share in claim.shares.values())

        backend.release = recording  # type: ignore[method-assign]

    def _record_allocations(self) -> None:
        """Note every allocate call of the host's backend, with the claim it hands the hook."""
        backend = self.host.backends.loaded[self.backend]
        allocate = backend.allocate

        async def recording(
            resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None = None
        ) -> ContainerAllocation:
            self.allocations.append((resource, tuple(device_ids), claim))
            return await allocate(resource, device_ids, claim)

        backend.allocate = recording  # type: ignore[method-assign]


def published_counter_sets(run: DraRun, resource: Resource) -> dict[str, set[str]]:
    """The counter sets (name -> counter names) in the resource's pool now."""
    pool, driver = run.pool(resource), run.driver(resource)
    return {
        found["name"]: set(found["counters"])
        for body in run.cluster.stored.values()
        if body["spec"]["pool"]["name"] == pool and body["spec"]["driver"] == driver
        for found in body["spec"].get("sharedCounters", ())
    }


def answer_problems(
    run: DraRun,
    resource: Resource,
    devices: Sequence[str],
    answer: Sequence[DraDevice],
    request: str = REQUEST,
) -> list[str]:
    """What is wrong with a prepared claim's answer: devices, pools, requests, CDI IDs."""
    what = f"{resource.name} claim of {list(devices)}"
    problems = []
    if sorted(d.device for d in answer) != sorted(devices):
        problems.append(f"{what}: answered devices {[d.device for d in answer]}")
    problems += [
        f"{what}: {d.device} answered in pool {d.pool!r}, not {run.pool(resource)!r}"
        for d in answer
        if d.pool != run.pool(resource)
    ]
    problems += [
        f"{what}: {d.device} answered for requests {list(d.requests)}, not [{request!r}]"
        for d in answer
        if request not in d.requests
    ]
    problems += [f"{what}: {p}" for d in answer for i in d.cdi_ids if (p := rules.cdi_name_problem(i))]
    ids = [i for d in answer for i in d.cdi_ids]
    if len(ids) != len(set(ids)):
        problems.append(f"{what}: a CDI device ID answered more than once: {ids}")
    problems += [f"{what}: {p}" for p in undefined_cdi_names(ids, run.cdi_dir)]
    return problems


def _sorted(ids: set[str] | None) -> list[str] | str:
    return "nothing" if ids is None else sorted(ids)


@contextlib.asynccontextmanager
async def dra_run(
    directory: Path,
    backend: str,
    plugin: object,
    settings: Mapping[str, Any],
    cdi_dir: Path,
    **config: Any,
) -> AsyncIterator[DraRun]:
    """The real host serving ``plugin`` through DRA only to a kubelet stand-in and a ClusterStandIn."""
    registry = directory / "dra-registry"
    cluster = ClusterStandIn()
    async with (
        KubeletStandIn(directory / "dra-device-plugins", registry) as kubelet,
        running_host(
            kubelet.device_plugins_dir,
            {backend: plugin},
            cluster=cluster,
            serve_through={backend: "dra"},
            node_name=NODE,
            dra_plugins_dir=directory / "dra-plugins",
            plugins_registry_dir=registry,
            cdi_dir=cdi_dir,
            backends={backend: dict(settings)},
            device_release=False,
            **config,
        ) as host,
    ):
        run = DraRun(backend, host, cluster, kubelet, cdi_dir)
        run._record_releases()
        run._record_allocations()
        yield run


def sample_configs(model: type[BaseModel] | None) -> list[dict[str, Any]]:
    """Configurations the backend takes: :data:`MAPPING_CONFIG` without a model; else the ones
    its model offers as examples (:func:`devicehost.host.backends.config_examples.config_examples`;
    whether the model accepts them is for the caller to check)."""
    if model is None:
        return [dict(MAPPING_CONFIG)]
    return config_examples(model)


def refused_config(valid: Mapping[str, Any]) -> dict[str, Any]:
    """``valid`` with a top-level key no model knows: refused at ``parameters.<UNKNOWN_KEY>``."""
    return {**valid, UNKNOWN_KEY: "devicehost conformance"}


def config_problem(model: type[BaseModel] | None, config: Mapping[str, Any]) -> str | None:
    """Why the backend's model refuses ``config`` (None: it takes it)."""
    if model is None:
        return None
    try:
        model.model_validate(config)
    except ValidationError as exc:
        return " ".join(str(exc).split())
    return None


def received_problem(model: type[BaseModel] | None, given: Mapping[str, Any], received: object) -> str | None:
    """What is wrong with the configuration the allocate hook received for ``given``: an instance
    of the model equal to ``given`` validated, or without a model the mapping as given."""
    if model is None:
        if received != given:
            return f"the hook received {received!r:.200}, not the mapping given {dict(given)!r:.200}"
        return None
    if not isinstance(received, model):
        return f"the hook received {received!r:.200}, not a {model.__name__}"
    if received != model.model_validate(given):
        return f"the hook received {received!r:.200}, not {given!r:.200} validated"
    return None
