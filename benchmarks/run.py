"""Run the benchmarks, print the table, write the JSON: ``python -m benchmarks.run [--quick]``.

Every measurement runs the host and a bare grpc.aio servicer side by side in the same run, with
the kubelet stand-in in this process as the client; see ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from benchmarks import allocate, coldstart, health, idle, realkubelet, restart, scale, soak, throughput
from benchmarks.dra_node_life import measure as dra_node_life
from benchmarks.dra_prepare import measure as dra_prepare
from benchmarks.dra_publish import measure as dra_publish
from benchmarks.figures import Figure
from benchmarks.procs import compile_sources
from benchmarks.settings import MODES, QUICK_TAKES, Settings

Measure = Callable[[Settings, Path], Awaitable[list[Figure]]]
MEASUREMENTS: dict[str, Measure] = {
    "allocate": allocate.measure,
    "health": health.measure,
    "scale": scale.measure,
    "restart": restart.measure,
    "soak": soak.measure,
    "coldstart": coldstart.measure,
    "throughput": throughput.measure,
    "kubelet": realkubelet.measure,
    "idle": idle.measure,
    "dra_prepare": dra_prepare,
    "dra_publish": dra_publish,
    "dra_node_life": dra_node_life,
}
PACKAGES = ("devicehost", "devicehost-example", "grpcio", "protobuf", "pluggy", "structlog", "asyncinotify")
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "results.json"


def machine() -> dict[str, Any]:
    """CPU model, cores, kernel and Python, as this run saw them."""
    models = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    return {
        "cpu_model": models[0] if models else platform.processor(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def table(figures: list[Figure]) -> str:
    """The figures as a Markdown table."""
    rows = [["measurement", "figure", "value", "unit", "bare baseline", "target", "result"]]
    for f in figures:
        verdict = {True: "PASS", False: "FAIL", None: ""}[f.passed]
        baseline = "" if f.baseline is None else f"{f.baseline:g}"
        rows.append([f.measurement, f.name, f"{f.value:g}", f.unit, baseline, str(f.target or ""), verdict])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


async def run(names: list[str], settings: Settings, workdir: Path) -> tuple[list[Figure], dict[str, float]]:
    figures: list[Figure] = []
    durations: dict[str, float] = {}
    for name in names:
        print(f"-- {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        figures += await MEASUREMENTS[name](settings, workdir)
        durations[name] = round(time.monotonic() - started, 2)
    return figures, durations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_const", dest="mode", const="quick", help=f"smaller: {QUICK_TAKES}"
    )
    size.add_argument(
        "--minimal", action="store_const", dest="mode", const="minimal", help="smallest, for the smoke test"
    )
    parser.add_argument("--only", action="append", choices=list(MEASUREMENTS), help="repeatable")
    parser.add_argument("--workdir", type=Path, help="keep sockets and server logs here")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    compile_sources()
    mode = args.mode or "full"
    names = args.only or list(MEASUREMENTS)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dhb-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        figures, durations = asyncio.run(run(names, MODES[mode], workdir))
    verdicts = [f.passed for f in figures if f.passed is not None]
    results = {
        "mode": mode,
        "started_at": started_at,
        "duration_s": round(time.monotonic() - started, 2),
        "measurement_durations_s": durations,
        "machine": machine(),
        "versions": versions(),
        "targets": {"met": verdicts.count(True), "missed": verdicts.count(False)},
        "figures": [f.to_json() for f in figures],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(figures))
    print(f"\n{results['targets']} in {results['duration_s']} s ({mode}); JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
