"""What the API server serves of DRA, probed once per host start and said in one log line.

Nothing here retries: a probe that fails leaves the cluster's DRA surface unknown (the host then
falls back as it does where a feature is off: unhealthy devices withdrawn, not tainted), and
each feature the cluster lacks is named once, with what the host does instead.
"""

from __future__ import annotations

import structlog

from devicehost.host.dra.cluster import Cluster, ClusterError
from devicehost.host.state import ClusterApi

FALLBACKS = {
    "device taints in slices": "unhealthy devices are withdrawn from their slice, not tainted",
    "binding conditions": "devices with binding conditions are published without them",
    "consumable capacity": "devices that allow multiple allocations are published without it",
    "DeviceTaintRule": "an admin's DeviceTaintRules are not served",
}
"""What the host does where the cluster lacks a feature."""

log = structlog.get_logger(__name__)


async def probe(cluster: Cluster, node: str, driver: str) -> ClusterApi | None:
    """The API server's DRA surface (None: unknown), said once."""
    try:
        served = await cluster.served_api(node, driver)
    except ClusterError as exc:
        log.warning("the API server's DRA versions and features are unknown; not asked again", error=str(exc))
        return None
    except Exception:  # a bug too: said with its traceback, and the snapshots never see it
        log.exception("asking the API server what it serves of DRA failed; not asked again")
        return None
    features = served.features
    lacking = [name for name, has in features.items() if not has]
    log.info(
        "the API server serves DRA",
        versions=",".join(served.versions),
        features=",".join(name for name, has in features.items() if has) or "none",
        lacking=",".join(lacking) or "none",
        taint_rules=served.taint_rules or "not served",
        fallbacks="; ".join(FALLBACKS[name] for name in lacking) or "none",
    )
    return ClusterApi(served.versions, features, served.taint_rules)
