"""The node-life benchmark runs end to end in its smallest mode and writes the JSON it promises.

Timings are never asserted here: only that the figures exist, are finite and are sane. The
measurement itself fails when the host registers its driver before every claim's CDI spec is
back on disk after the reboot it stages.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarking import minimal_run


def test_node_life_measurement_writes_results(tmp_path: Path) -> None:
    results = minimal_run(tmp_path, "dra_node_life")
    figures = {f["name"]: f for f in results["figures"]}
    assert {f["measurement"] for f in figures.values()} == {"dra_node_life"}
    reboot = figures["reboot with 256 claims: start to registered, specs rewritten p50"]
    assert reboot["unit"] == "ms"
    assert reboot["target"] == "< 1000"
    assert 0 < reboot["baseline"] < reboot["value"] < 60_000
    for call in ("prepare", "unprepare"):
        for held in (1, 256):
            assert 0 < figures[f"{call}, {held} held p50"]["value"] < 10_000
        flat = figures[f"{call}, 256 held / 1 held"]
        assert flat["target"] == "<= 1.5"
        base = figures[f"{call}, 1 held p50"]["value"]
        assert flat["value"] == round(figures[f"{call}, 256 held p50"]["value"] / base, 3)
    for figure in figures.values():
        assert math.isfinite(figure["value"])
    assert results["targets"]["met"] + results["targets"]["missed"] == 3
