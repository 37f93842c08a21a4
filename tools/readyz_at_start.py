"""How ``/readyz`` answers over a host's first second: a real ``devicehost run``, polled every 2 ms.

Each start runs the example backend (two resources) with no kubelet: nothing can be registered, so
every ``200`` is an early yes. Prints one line per start and a closing count::

    python tools/readyz_at_start.py --starts 20
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

POLL_EVERY = 0.002
WATCH_FOR = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def readyz(port: int) -> tuple[int, str] | None:
    """``GET /readyz`` once; None while nothing listens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/readyz")
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    except OSError:
        return None
    finally:
        connection.close()


def one_start(work: Path) -> Counter[str]:
    """Start a host, poll ``/readyz`` over its first second (from the first answer), stop it."""
    port = free_port()
    plugins = work / "device-plugins"
    plugins.mkdir(parents=True)
    command = [sys.executable, "-m", "devicehost", "run", "--backend", "example"]
    command += ["--device-plugins-dir", str(plugins), "--cdi-dir", str(work / "cdi")]
    command += ["--pod-resources-socket", str(work / "pod-resources.sock")]
    command += ["--metrics-address", f"127.0.0.1:{port}", "--log-format", "json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEHOST_")}
    env["DEVICEHOST_EXAMPLE_RESOURCES"] = "example.com/a=2,example.com/b=2"
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    answers: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 30
        while (first := readyz(port)) is None and time.monotonic() < deadline:
            time.sleep(POLL_EVERY)
        if first is None:
            raise SystemExit("the host never answered /readyz")
        until = time.monotonic() + WATCH_FOR
        answer: tuple[int, str] | None = first
        while time.monotonic() < until:
            if answer is not None:
                answers[f"{answer[0]} {answer[1].splitlines()[-1].strip()}"] += 1
            time.sleep(POLL_EVERY)
            answer = readyz(port)
    finally:
        child.terminate()
        child.wait(10)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    starts = parser.parse_args().starts
    early = 0
    for n in range(starts):
        work = Path(tempfile.mkdtemp(prefix="dh-readyz-", dir="/tmp"))
        try:
            answers = one_start(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        yes = sum(count for line, count in answers.items() if line.startswith("200"))
        early += yes > 0
        print(f"start {n + 1}: {sum(answers.values())} answers, {yes} early 200: {dict(answers)}")
    print(f"{early} of {starts} starts answered 200 before anything could be registered")


if __name__ == "__main__":
    main()
