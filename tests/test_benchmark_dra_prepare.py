"""The DRA prepare benchmark runs end to end in its smallest mode and writes the JSON it promises.

Timings are never asserted here: only that the figures exist, are finite and are sane. The
measurement itself fails when the host and the bare servicer answer differently or write
different CDI specs, so a passing run also says the comparison is like for like.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarking import minimal_run


def test_dra_prepare_measurement_writes_results(tmp_path: Path) -> None:
    results = minimal_run(tmp_path, "dra_prepare")
    assert results["mode"] == "minimal"
    figures = {f["name"]: f for f in results["figures"]}
    assert {f["measurement"] for f in figures.values()} == {"dra_prepare"}
    for count in (1, 8):
        for pct in (50, 99):
            latency = figures[f"{count} claim(s) p{pct}"]
            assert latency["unit"] == "ms"
            assert 0 < latency["value"] < 10_000
            assert 0 < latency["baseline"] < 10_000
            ratio = figures[f"{count} claim(s) p{pct} host/bare"]
            assert ratio["target"] == "<= 1.2"
            assert ratio["value"] == round(latency["value"] / latency["baseline"], 3)
        cpu = figures[f"{count} claim(s) server CPU per call"]
        assert cpu["value"] > 0
        assert cpu["baseline"] > 0
    for figure in figures.values():
        assert math.isfinite(figure["value"])
        assert (figure["target"] is None) == (figure["passed"] is None)
    assert results["targets"]["met"] + results["targets"]["missed"] == 4
