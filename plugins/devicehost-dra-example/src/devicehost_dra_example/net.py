"""The reference driver's ``net`` profile: NICs whose bandwidth claims share (``net.example.com``).

Each NIC allows multiple allocations: a claim asks for ingress and egress bandwidth
(``capacity.requests``), the scheduler hands out shares of the NIC's 100G each way and never
more, and the container learns its share's rates (``NET_DEVICE_<n>_INGRESS_RATE``, in bits per
second) and ID. A separate backend (entry point ``dra-example-net``), as the reference installs
each profile as its own driver, with its own claim configuration model (:class:`NetConfig`).
"""

from __future__ import annotations

import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

import devicehost
from devicehost import Capacity, ClaimRequest, ContainerAllocation, Device, Resource, Version, quantity
from devicehost_dra_example.node import node_name, seeded_uuids

DRIVER = "net.example.com"
RESOURCE = f"{DRIVER}/nic"
MODEL = "LATEST-NET-MODEL"
MAX_BURST = 8 * (2**32 - 1)
"""Bits: a burst of 4 GB or more is refused (the reference's limit)."""
BANDWIDTH = Capacity("100G", default="1G", min="100M", max="100G", step="1M")
"""Each direction of a NIC: 100G, shared; a claim asking for nothing takes 1G."""
VFS = Capacity(100, default=1, valid_values=(1,))
"""Virtual functions: each share takes exactly one of a NIC's 100."""


class NetSettings(BaseModel):
    """``backends.dra-example-net`` in the host config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_nics: NonNegativeInt = Field(
        default=1, description="mock NICs on this node (the reference's --num-devices)"
    )
    node_name: str | None = Field(
        default=None, description="seeds the NICs' UUIDs; unset: the node the host names, else the host name"
    )


class BandwidthBurst(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ingressBurst: NonNegativeInt = Field(default=0, le=MAX_BURST)
    egressBurst: NonNegativeInt = Field(default=0, le=MAX_BURST)


class NetConfig(BaseModel):
    """``{apiVersion: net.resource.example.com/v1alpha1, kind: NetConfig, bwBurst: {...}}``: the
    most a share may burst, each way, in bits (0: no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["net.resource.example.com/v1alpha1"]
    kind: Literal["NetConfig"]
    bwBurst: BandwidthBurst = BandwidthBurst()


def nics(count: int, seed: str) -> Resource:
    """``nic-0`` .. ``nic-<count-1>``, each shared by bandwidth."""
    devices = tuple(
        Device(
            f"nic-{i}",
            attributes={
                "index": i,
                "uuid": nic_uuid,
                "model": MODEL,
                "driverVersion": Version("1.0.0"),
            },
            capacity={"vfs": VFS, "ingressBandwidth": BANDWIDTH, "egressBandwidth": BANDWIDTH},
            allow_multiple_allocations=True,
        )
        for i, nic_uuid in enumerate(seeded_uuids(seed, "net", count))
    )
    return Resource(RESOURCE, devices, serve_through="dra")


def share_env(device: str, share: devicehost.Share | None, config: NetConfig) -> dict[str, str]:
    """What the reference hands a container for one NIC share: its rates, bursts and share ID."""
    key = f"NET_DEVICE_{device.removeprefix('nic-')}"
    env = {key: device}
    burst = config.bwBurst
    if burst.ingressBurst:
        env[f"{key}_INGRESS_BURST"] = str(burst.ingressBurst)
    if burst.egressBurst:
        env[f"{key}_EGRESS_BURST"] = str(burst.egressBurst)
    if share is not None:
        for name, rate in (("ingressBandwidth", "INGRESS_RATE"), ("egressBandwidth", "EGRESS_RATE")):
            if name in share.consumed:
                env[f"{key}_{rate}"] = str(int(quantity.parse(share.consumed[name])))
        env[f"{key}_SHARE_ID"] = share.id
    return env


class DraExampleNetBackend:
    """``num_nics`` mock NICs whose bandwidth claims share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._host_node = ""
        """The node the host told (``devicehost_host_facts``)."""
        self._settings = NetSettings()

    @devicehost.hookimpl
    def devicehost_settings_model(self) -> type[NetSettings]:
        return NetSettings

    @devicehost.hookimpl
    def devicehost_claim_config_model(self) -> type[NetConfig]:
        return NetConfig

    @devicehost.hookimpl
    def devicehost_configure(self, settings: NetSettings) -> None:
        with self._lock:
            self._settings = settings

    @devicehost.hookimpl
    def devicehost_host_facts(self, facts: devicehost.HostFacts) -> None:
        with self._lock:
            self._host_node = facts.node_name

    def _node(self) -> str:
        return node_name(self._settings.node_name, self._host_node)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            count, seed = self._settings.num_nics, self._node()
        return [nics(count, seed)]

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> ContainerAllocation:
        with self._lock:
            count, node = self._settings.num_nics, self._node()
        unknown = sorted(set(device_ids) - {f"nic-{i}" for i in range(count)})
        if resource != RESOURCE or unknown:
            raise ValueError(f"no such NIC in {resource}: {', '.join(unknown) or device_ids}")
        config = (
            claim.config
            if claim is not None and claim.config is not None
            else NetConfig(apiVersion="net.resource.example.com/v1alpha1", kind="NetConfig")
        )
        envs = {"KUBERNETES_NODE_NAME": node, "DRA_RESOURCE_DRIVER_NAME": DRIVER}
        for device in device_ids:
            envs |= share_env(device, claim.shares.get(device) if claim else None, config)
        return ContainerAllocation(envs=envs)
