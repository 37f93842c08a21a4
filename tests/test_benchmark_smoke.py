"""The benchmark runs end to end in its smallest mode and writes the JSON it promises.

Timings are never asserted here: only that the figures exist, are finite and are sane.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from benchmarking import minimal_run

REPO = Path(__file__).resolve().parent.parent


def test_allocate_measurement_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", "allocate", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRPC_")},
        timeout=60,
    )
    assert [line for line in done.stderr.splitlines() if ".cc:" in line] == []  # no C-core INFO lines
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
    results = minimal_run(tmp_path, "soak", timeout=300)
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


def test_a_bare_baseline_of_zero_gives_the_host_figure_without_a_ratio() -> None:
    """The bare server used 0 CPU in its idle window: no ZeroDivisionError, the host's own
    figure and target stay."""
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks.figures import Target, compared
    finally:
        sys.path.remove(str(REPO))

    figures = compared("idle", "CPU", 0.4, 0.0, "%", ratio_target=Target("<=", 2), target=Target("<=", 1))
    assert [(f.name, f.value, f.passed) for f in figures] == [("CPU", 0.4, True)]
    assert [f.name for f in compared("idle", "CPU", 0.4, 0.2, "%")] == ["CPU", "CPU host/bare"]


def test_profile_without_py_spy_says_so_in_one_line(tmp_path: Path) -> None:
    """No py-spy on PATH nor beside the interpreter: one line, exit 1, no traceback."""
    bare_python = tmp_path / "bin" / "python"
    bare_python.parent.mkdir()
    bare_python.symlink_to(sys.executable)  # sys.executable's dir has no py-spy
    env = {"PATH": str(bare_python.parent), "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [str(bare_python), "-m", "benchmarks.profile", "--seconds", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "benchmarks.profile: py-spy is not installed (pip install py-spy), nothing was measured"
    ]


def test_quick_says_how_long_it_takes_as_measured() -> None:
    """``--help`` and the README give ``--quick``'s measured duration, from one constant."""
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks.settings import QUICK_TAKES
    finally:
        sys.path.remove(str(REPO))
    shown = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert QUICK_TAKES in " ".join(shown.stdout.split())
    assert f"`--quick` for a smaller run of {QUICK_TAKES})" in " ".join(
        (REPO / "README.md").read_text().split()
    )


def test_restart_measurement_includes_a_series_under_load(tmp_path: Path) -> None:
    """Issue 26: restarts are also measured while another process keeps a core busy."""
    figures = {f["name"]: f for f in minimal_run(tmp_path, "restart")["figures"]}
    assert figures["1 resources under load: restarts with every resource back"]["target"] == ">= 2"
    for stat, target in (("p99", "< 50"), ("max", "< 200")):
        figure = figures[f"1 resources under load back {stat}"]
        assert figure["target"] == target
        assert math.isfinite(figure["value"])
        assert figure["value"] > 0
        assert 0 < figure["baseline"] < 10_000
