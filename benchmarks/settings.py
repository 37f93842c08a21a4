"""How big each measurement runs in each mode."""

from __future__ import annotations

from dataclasses import dataclass

QUICK_TAKES = "1.5 to 3.5 minutes"
"""How long ``--quick`` takes, measured: 82-90 s on the machine of issue 26, 178 s on an idle
2-core machine, 197 s on the same 2 cores busy with other work (the README and ``--help`` say this)."""


@dataclass(frozen=True)
class Settings:
    """Sample counts and sizes; ``full`` takes about 8 minutes on 2 cores, ``quick`` :data:`QUICK_TAKES`."""

    allocate_samples: int
    push_samples: int
    push_sizes: tuple[int, ...]
    poll_samples: int
    poll_interval: float
    scale_counts: tuple[int, ...]
    scale_allocations: int
    restart_counts: tuple[tuple[int, int], ...]
    """(resources, restarts) pairs."""
    restart_loaded: tuple[int, int]
    """(resources, restarts) while another process keeps a core busy (issue 26)."""
    kubelet_restarts: int
    """Restarts of the real kubelet (``realkubelet``)."""
    cold_starts: int
    throughput_seconds: float
    idle_seconds: float
    soak_restarts: int
    flap_seconds: float
    """How long one of 1,000 DRA devices flaps every 100 ms (``dra_publish``), per publisher."""


MODES = {
    "full": Settings(
        allocate_samples=2000,
        push_samples=150,
        push_sizes=(8, 128, 1024),
        poll_samples=8,
        poll_interval=1.0,
        scale_counts=(1, 10, 100, 300),
        scale_allocations=1000,
        restart_counts=((1, 1000), (3, 1000), (10, 100), (100, 20)),
        restart_loaded=(3, 300),
        kubelet_restarts=10,
        cold_starts=5,
        throughput_seconds=10.0,
        idle_seconds=60.0,
        soak_restarts=10000,
        flap_seconds=30.0,
    ),
    "quick": Settings(
        allocate_samples=400,
        push_samples=40,
        push_sizes=(8, 128, 1024),
        poll_samples=3,
        poll_interval=1.0,
        scale_counts=(1, 10, 100, 300),
        scale_allocations=200,
        restart_counts=((1, 100), (3, 100), (10, 10), (100, 5)),
        restart_loaded=(3, 30),
        kubelet_restarts=3,
        cold_starts=2,
        throughput_seconds=2.0,
        idle_seconds=10.0,
        soak_restarts=1000,
        flap_seconds=10.0,
    ),
    "minimal": Settings(
        allocate_samples=50,
        push_samples=10,
        push_sizes=(8, 128),
        poll_samples=1,
        poll_interval=0.5,
        scale_counts=(1, 10),
        scale_allocations=50,
        restart_counts=((1, 2),),
        restart_loaded=(1, 2),
        kubelet_restarts=2,
        cold_starts=1,
        throughput_seconds=0.5,
        idle_seconds=1.0,
        soak_restarts=20,
        flap_seconds=3.0,
    ),
}
