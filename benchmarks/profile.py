"""Where the host's time goes under Allocate load: py-spy samples ``devicehost run`` meanwhile.

``python -m benchmarks.profile [--seconds 10]`` drives sequential Allocates (the kubelet's
pattern) at one resource, records the host with ``py-spy record --format raw`` (needs
``pip install py-spy``), and prints the functions with the most samples, own and inclusive.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import launch, running

RESOURCE = "host.example.com/r0"
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "allocate.pyspy.txt"
TOP = 25


async def drive(workdir: Path, seconds: float, out: Path) -> int:
    """Allocate for ``seconds`` while py-spy records the host; the number of Allocates."""
    directory = workdir / "profile"
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    done = 0
    async with (
        TimedKubelet(directory) as kubelet,
        running(await launch("host", directory, {RESOURCE: 16}, workdir / "profile-host.log")) as host,
    ):
        await wait_all(kubelet, [RESOURCE], timeout=30)
        argv = [py_spy, "record", "--pid", str(host.proc.pid), "--format", "raw", "--rate", "500"]
        argv += ["--duration", str(int(seconds)), "--threads", "--output", str(out)]
        recorder = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await kubelet.allocate_ids(RESOURCE, [f"r0-{done % 16}"])
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
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="py-spy raw (collapsed) stacks")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dhp-") as tmp:
        done = asyncio.run(drive(Path(tmp), args.seconds, args.out))
    print(f"{done} Allocates in {args.seconds:g} s")
    print(summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
