"""The ``kubelet`` benchmark runs in its smallest mode against the real device manager.

Timings are never asserted here: only that every figure exists, is finite and has its Go baseline.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dpharness import PEER_ENV

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
FIGURES = (
    "process start to allocatable p50",
    "Allocate through the device manager p50",
    "Allocate through the device manager p99",
    "raw Allocate RPC (probe) p50",
    "kubelet restart to allocatable max",
)


def run_benchmark(out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", "kubelet", "--out", str(out)]
    return subprocess.run(argv, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=200)


def test_the_benchmark_sets_the_host_beside_the_go_plugin(peer: Path, tmp_path: Path) -> None:
    run_benchmark(tmp_path / "results.json", {**os.environ, PEER_ENV: str(peer)})
    figures = {f["name"]: f for f in json.loads((tmp_path / "results.json").read_text())["figures"]}
    for name in FIGURES:
        assert 0 < figures[name]["value"] < 60_000, figures[name]
        assert 0 < figures[name]["baseline"] < 60_000, figures[name]
        ratio = figures[f"{name} host/go"]["value"]
        assert math.isfinite(ratio)
        assert ratio > 0


def test_without_the_harness_the_benchmark_says_why_and_reports_nothing(peer: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != PEER_ENV}
    done = run_benchmark(tmp_path / "results.json", env)
    assert f"skipped: {PEER_ENV} is not set" in done.stderr
    assert json.loads((tmp_path / "results.json").read_text())["figures"] == []
