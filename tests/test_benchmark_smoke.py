"""The benchmark runs end to end in its smallest mode and writes the JSON it promises.

Timings are never asserted here: only that the figures exist, are finite and are sane.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_allocate_measurement_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", "allocate", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    results = json.loads(out.read_text())
    assert results["mode"] == "minimal"
    assert results["machine"]["cores"] >= 1
    assert results["machine"]["cpu_model"]
    assert results["versions"]["grpcio"]
    assert results["versions"]["devicehost"]
    figures = results["figures"]
    assert {f["measurement"] for f in figures} == {"allocate"}
    names = {f["name"] for f in figures}
    for count in (1, 4):
        for pct in (50, 99):
            assert f"{count} device(s) p{pct}" in names
            assert f"{count} device(s) p{pct} host/bare" in names
    for figure in figures:
        assert set(figure) >= {"measurement", "name", "value", "unit", "baseline", "target", "passed"}
        assert math.isfinite(figure["value"])
        assert figure["value"] > 0
        if figure["unit"] == "ms":
            assert 0 < figure["baseline"] < 10_000
        assert (figure["target"] is None) == (figure["passed"] is None)
    targets = [f for f in figures if f["target"] is not None]
    assert len(targets) == 4
    assert results["targets"]["met"] + results["targets"]["missed"] == len(targets)


def test_soak_measurement_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", "soak", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    results = json.loads(out.read_text())
    assert results["mode"] == "minimal"
    figures = {f["name"]: f for f in results["figures"]}
    assert {f["measurement"] for f in figures.values()} == {"soak"}
    warmup = 2  # minimal: 20 restarts, the warm-up a tenth of them
    targeted = [
        "restarts with the resource back",
        *(f"{what} growth after restart {warmup}" for what in ("RSS", "threads", "fds", "tasks")),
    ]
    informative = ["restart to back p50", f"RSS at restart {warmup}", "RSS at end"]
    assert set(figures) >= {*targeted, *informative}
    for figure in figures.values():
        assert math.isfinite(figure["value"])
        assert figure["baseline"] is not None
        assert math.isfinite(figure["baseline"])
        assert (figure["target"] is None) == (figure["passed"] is None)
    assert {name for name, f in figures.items() if f["target"] is not None} == set(targeted)
    assert figures["restarts with the resource back"]["target"] == ">= 20"
    for name in (f"RSS at restart {warmup}", "RSS at end"):
        assert figures[name]["value"] > 0
        assert figures[name]["baseline"] > 0
    assert results["targets"]["met"] + results["targets"]["missed"] == len(targeted)


def test_imports_report_names_what_only_the_host_imports() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.imports", "--runs", "1"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("wall, best of 1: host ")
    packages = [line.split("ms  ", 1)[1] for line in lines if "ms  " in line]
    # the host's own rooms and its config library are imported; the bare servicer has neither
    assert "devicehost.host.config" in packages
    assert "pydantic" in packages
    assert "grpc" not in packages


def test_restart_measurement_includes_a_series_under_load(tmp_path: Path) -> None:
    """Issue 26: restarts are also measured while another process keeps a core busy."""
    out = tmp_path / "results.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", "restart", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    figures = {f["name"]: f for f in json.loads(out.read_text())["figures"]}
    assert figures["1 resources under load: restarts with every resource back"]["target"] == ">= 2"
    for stat, target in (("p99", "< 50"), ("max", "< 200")):
        figure = figures[f"1 resources under load back {stat}"]
        assert figure["target"] == target
        assert math.isfinite(figure["value"])
        assert figure["value"] > 0
        assert 0 < figure["baseline"] < 10_000
