"""What the API server serves of DRA, asked once at start: one line when it answers, one warning
(and a fallback, never a retry) when it does not."""

from __future__ import annotations

from structlog.testing import capture_logs

from devicehost.host.dra.features import probe
from devicehost.testing.cluster import ClusterStandIn


async def test_the_answer_is_one_line_naming_versions_features_and_fallbacks() -> None:
    with capture_logs() as logs:
        found = await probe(ClusterStandIn("1.35"), "node-a", "example.com")
    assert found is not None
    assert found.versions == ("v1",)
    assert not any(found.features.values())  # 1.35's defaults: every gated feature off
    (line,) = logs
    assert line["event"] == "the API server serves DRA"
    assert "unhealthy devices are withdrawn from their slice, not tainted" in line["fallbacks"]


async def test_an_api_server_that_does_not_answer_leaves_it_unknown_said_once() -> None:
    cluster = ClusterStandIn("1.36")
    cluster.down = "listing resource.k8s.io/v1 resourceslices: 503 Service Unavailable"
    with capture_logs() as logs:
        assert await probe(cluster, "node-a", "example.com") is None
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "the API server's DRA versions and features are unknown; not asked again")
    ]
