"""How big each measurement runs in each mode."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Sample counts and sizes; ``full`` fits 5 minutes on 2 cores, ``quick`` 60 s."""

    allocate_samples: int
    push_samples: int
    push_sizes: tuple[int, ...]
    poll_samples: int
    poll_interval: float
    scale_counts: tuple[int, ...]
    scale_allocations: int
    restart_counts: tuple[int, ...]
    restarts: int
    cold_starts: int
    throughput_seconds: float
    idle_seconds: float


MODES = {
    "full": Settings(
        allocate_samples=2000,
        push_samples=150,
        push_sizes=(8, 128, 1024),
        poll_samples=8,
        poll_interval=1.0,
        scale_counts=(1, 10, 100, 300),
        scale_allocations=1000,
        restart_counts=(1, 10, 100),
        restarts=10,
        cold_starts=5,
        throughput_seconds=10.0,
        idle_seconds=60.0,
    ),
    "quick": Settings(
        allocate_samples=400,
        push_samples=40,
        push_sizes=(8, 128, 1024),
        poll_samples=3,
        poll_interval=1.0,
        scale_counts=(1, 10, 100, 300),
        scale_allocations=200,
        restart_counts=(1, 10, 100),
        restarts=3,
        cold_starts=2,
        throughput_seconds=2.0,
        idle_seconds=10.0,
    ),
    "minimal": Settings(
        allocate_samples=50,
        push_samples=10,
        push_sizes=(8, 128),
        poll_samples=1,
        poll_interval=0.5,
        scale_counts=(1, 10),
        scale_allocations=50,
        restart_counts=(1,),
        restarts=2,
        cold_starts=1,
        throughput_seconds=0.5,
        idle_seconds=1.0,
    ),
}
