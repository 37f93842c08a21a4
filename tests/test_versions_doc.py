"""docs/dra.md's "Versions" table is the stand-ins' version table (standin/versions.py): each
DRA feature gate's stage and default per Kubernetes version, and what devicehost does."""

from __future__ import annotations

from pathlib import Path

from devicehost.standin.versions import FEATURES, VERSIONS, KubernetesVersion

DOC = Path(__file__).resolve().parents[1] / "docs" / "dra.md"


def _cell(gate: str, version: str) -> str:
    feature = next(f for f in FEATURES if f.gate == gate)
    stage = feature.stages.get(version)
    if stage is None:
        return "-"
    if stage == "GA":
        return "GA"
    return f"{stage}, {'on' if KubernetesVersion(version).enabled(gate) else 'off'}"


def versions_table() -> str:
    """The table as docs/dra.md must carry it."""
    lines = [
        "| feature gate | " + " | ".join(VERSIONS) + " | what devicehost does |",
        "|---|" + "---|" * len(VERSIONS) + "---|",
    ]
    lines += [
        f"| `{f.gate}` | " + " | ".join(_cell(f.gate, v) for v in VERSIONS) + f" | {f.devicehost} |"
        for f in FEATURES
    ]
    return "\n".join(lines)


def test_the_docs_versions_table_is_the_stand_ins_table() -> None:
    table = versions_table()
    assert table in DOC.read_text(), f"docs/dra.md's Versions table must read:\n\n{table}\n"


def test_the_versions_the_stand_ins_know_are_the_ones_documented() -> None:
    text = DOC.read_text()
    assert all(f"`--kubernetes-version {v}`" in text or v in text for v in VERSIONS)
    assert "--kubernetes-version" in text
