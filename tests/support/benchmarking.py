"""``python -m benchmarks.run --minimal --only <measurement>`` as the smoke tests run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def minimal_run(tmp_path: Path, measurement: str, timeout: float = 120) -> dict[str, Any]:
    """Run one measurement in its smallest mode; the results file it wrote."""
    out = tmp_path / "results.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--minimal", "--only", measurement, "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    results: dict[str, Any] = json.loads(out.read_text())
    return results
