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
