"""Where the host's time goes: py-spy samples ``devicehost run`` while the stand-in drives it.

``python -m benchmarks.profile [--scenario allocate|restart] [--seconds 10]`` drives either
sequential Allocates (the kubelet's pattern) at one resource, or kubelet restarts one after the
other with 100 resources, records the host with ``py-spy record --format raw`` (needs
``pip install py-spy``), and prints the functions with the most samples, own and inclusive.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import launch, running

RESOURCE = "host.example.com/r0"
RESTART_RESOURCES = [f"host.example.com/k{i}" for i in range(100)]
OUT_DIR = Path(__file__).resolve().parent / "out"
TOP = 25


NO_PY_SPY = "benchmarks.profile: py-spy is not installed (pip install py-spy), nothing was measured"


def find_py_spy() -> str | None:
    """The py-spy command: on PATH, or beside this interpreter (a venv not activated); None if neither."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


async def drive(scenario: str, workdir: Path, seconds: float, out: Path, py_spy: str) -> int:
    """Run ``scenario`` for ``seconds`` while py-spy records the host; how many rounds it did."""
    directory = workdir / "profile"
    names = [RESOURCE] if scenario == "allocate" else RESTART_RESOURCES
    done = 0
    async with (
        TimedKubelet(directory) as kubelet,
        running(
            await launch("host", directory, dict.fromkeys(names, 16), workdir / "profile-host.log")
        ) as host,
    ):
        await wait_all(kubelet, names, timeout=30)
        argv = [py_spy, "record", "--pid", str(host.proc.pid), "--format", "raw", "--rate", "500"]
        argv += ["--duration", str(int(seconds)), "--threads", "--output", str(out)]
        recorder = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if scenario == "allocate":
                await kubelet.allocate_ids(RESOURCE, [f"r0-{done % 16}"])
            else:
                await kubelet.restart()
                await wait_all(kubelet, names, timeout=10)
            done += 1
        await recorder.wait()
    return done


def summary(raw: Path) -> str:
    """Top functions by own samples and by inclusive samples, from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{total} samples"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        lines.append(f"\ntop {TOP} by {title} samples:")
        lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(TOP)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=["allocate", "restart"], default="allocate")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--out", type=Path, help="py-spy raw (collapsed) stacks; default out/<scenario>.pyspy.txt"
    )
    args = parser.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:  # said before anything starts: one line, no traceback
        print(NO_PY_SPY, file=sys.stderr)
        return 1
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    out = args.out or OUT_DIR / f"{args.scenario}.pyspy.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dhp-") as tmp:
        done = asyncio.run(drive(args.scenario, Path(tmp), args.seconds, out, py_spy))
    print(f"{done} {'Allocates' if args.scenario == 'allocate' else 'restarts'} in {args.seconds:g} s")
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
