"""What the host imports on its way to serving that the bare servicer does not, and what it costs.

``python -m benchmarks.imports`` imports the start path of ``devicehost run --backend example``
(the command, ``devicehost.host.app`` and the example backend) and the bare servicer, each in a
fresh interpreter with ``-X importtime`` and bytecode compiled, and prints each side's wall time
(best of several) and the modules only the host imports, their own import time summed per
package. The cold start figure in ``benchmarks.run`` is mostly this difference.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time

from benchmarks.procs import REPO, compile_sources

HOST = "import devicehost.host.cli.cmd_run, devicehost.host.app, devicehost_example"
BARE = "import benchmarks.bare_server"
TOP = 30


def own_times(statement: str) -> dict[str, int]:
    """Module -> its own import time in microseconds, from ``python -X importtime``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    times = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, _, name = line.removeprefix("import time:").split("|")
            times[name.strip()] = int(own)
    return times


def wall_ms(statement: str, runs: int) -> float:
    """The best of ``runs`` wall times of a fresh interpreter running ``statement``."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], cwd=REPO, check=True)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def package(module: str) -> str:
    """The top-level package, or for devicehost its room (``devicehost.host.config``)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[0] == "devicehost" else parts[0]


def report(runs: int) -> str:
    host, bare = own_times(HOST), own_times(BARE)
    extra: collections.Counter[str] = collections.Counter()
    for module, own in host.items():
        if module not in bare:
            extra[package(module)] += own
    lines = [
        f"wall, best of {runs}: host {wall_ms(HOST, runs):.1f} ms, bare {wall_ms(BARE, runs):.1f} ms, "
        f"interpreter alone {wall_ms('pass', runs):.1f} ms",
        f"own import time (-X importtime, which adds its own cost): host {sum(host.values()) / 1000:.1f} ms, "
        f"bare {sum(bare.values()) / 1000:.1f} ms, only the host's modules {sum(extra.values()) / 1000:.1f} ms",
        f"\ntop {TOP} packages only the host imports, by own import time:",
    ]
    lines += [f"{own / 1000:6.1f} ms  {name}" for name, own in extra.most_common(TOP)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="wall-time runs per side")
    args = parser.parse_args()
    compile_sources()
    print(report(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
