"""The kubelet's DRAPlugin service (``host/dra/servicer.py``) over a real unix socket: each
claim of a call handed on as (namespace, uid, name), each answer its devices (request, pool,
device, CDI IDs, share ID only for a share) or its one error, and every call observed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence

import grpc
import pytest
from unixgrpc import channel_to

from devicehost.host.dra.checkpoint import PreparedClaim, PreparedDevice
from devicehost.host.dra.servicer import ClaimRef, DraPluginServicer
from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc

WHOLE = PreparedDevice("gpu", "n/widget", "w0", "example.com/widget", "w0", ("example.com/claim-u1=gpu",))
SHARED = PreparedDevice(
    "nic/fast", "n/nic", "n0", "example.com/nic", "n0", ("example.com/claim-u1=nic",), share="s-1"
)


class Calls:
    """What the servicer hands on and what it observes."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[ClaimRef]]] = []
        self.observed: list[tuple[str, list[bool]]] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        self.asked.append(("prepare", list(claims)))
        return {
            "u1": PreparedClaim("u1", "team-a", "c1", (WHOLE, SHARED)),
            "u2": "device 'w9' is not in pool",
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.asked.append(("unprepare", list(claims)))
        return {"u1": "", "u2": "release hook failed"}

    def observe(self, operation: str, outcomes: Iterable[bool], seconds: float) -> None:
        assert seconds >= 0
        self.observed.append((operation, list(outcomes)))


@pytest.fixture
async def served() -> AsyncIterator[tuple[Calls, api_pb2_grpc.DRAPluginStub]]:
    calls = Calls()
    server = grpc.aio.server()
    api_pb2_grpc.add_DRAPluginServicer_to_server(
        DraPluginServicer(calls.prepare, calls.unprepare, calls.observe), server
    )
    async with channel_to(server) as channel:
        yield calls, api_pb2_grpc.DRAPluginStub(channel)


CLAIMS = [
    api_pb2.Claim(namespace="team-a", uid="u1", name="c1"),
    api_pb2.Claim(namespace="team-b", uid="u2", name="c2"),
]


async def test_prepare_answers_each_claim_its_devices_or_its_error(
    served: tuple[Calls, api_pb2_grpc.DRAPluginStub],
) -> None:
    calls, stub = served
    response = await stub.NodePrepareResources(api_pb2.NodePrepareResourcesRequest(claims=CLAIMS))
    assert calls.asked == [("prepare", [("team-a", "u1", "c1"), ("team-b", "u2", "c2")])]
    whole, shared = response.claims["u1"].devices
    assert (list(whole.request_names), whole.pool_name, whole.device_name, list(whole.cdi_device_ids)) == (
        ["gpu"],
        "n/widget",
        "w0",
        ["example.com/claim-u1=gpu"],
    )
    assert not whole.HasField("share_id")  # held whole: no share ID at all, not an empty one
    assert (list(shared.request_names), shared.share_id) == (["nic/fast"], "s-1")
    assert response.claims["u1"].error == ""
    assert (list(response.claims["u2"].devices), response.claims["u2"].error) == (
        [],
        "device 'w9' is not in pool",
    )
    assert calls.observed == [("prepare", [True, False])]


async def test_unprepare_answers_each_claim_its_error_or_none(
    served: tuple[Calls, api_pb2_grpc.DRAPluginStub],
) -> None:
    calls, stub = served
    response = await stub.NodeUnprepareResources(api_pb2.NodeUnprepareResourcesRequest(claims=CLAIMS))
    assert calls.asked == [("unprepare", [("team-a", "u1", "c1"), ("team-b", "u2", "c2")])]
    assert {uid: answer.error for uid, answer in response.claims.items()} == {
        "u1": "",
        "u2": "release hook failed",
    }
    assert calls.observed == [("unprepare", [True, False])]
