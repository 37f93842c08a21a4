"""The codebase keeps its shape: small classes and functions, and no module that imports the test kit.

Limits from the architecture page (docs/architecture.md): no class over 150 lines and no function
over 60, generated code aside. Import layering is checked by import-linter in the lint env.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "src" / "devicehost", *sorted((ROOT / "plugins").glob("*/src"))]
GENERATED = ROOT / "src" / "devicehost" / "proto"
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60


def _python_files() -> Iterator[Path]:
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def _sizes(kind: type[ast.AST] | tuple[type[ast.AST], ...]) -> Iterator[tuple[str, int]]:
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, kind):
                assert isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                end = node.end_lineno or node.lineno
                yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", end - node.lineno + 1


def test_the_sources_are_found() -> None:
    files = list(_python_files())
    assert any(p.name == "daemon.py" for p in files)
    assert not any(GENERATED in p.parents for p in files)


@pytest.mark.parametrize(
    ("kind", "limit"),
    [(ast.ClassDef, MAX_CLASS_LINES), ((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)],
    ids=["classes", "functions"],
)
def test_no_unit_is_too_long_to_read_in_one_sitting(kind: type[ast.AST], limit: int) -> None:
    too_long = [f"{where} ({lines} lines)" for where, lines in _sizes(kind) if lines > limit]
    assert not too_long, f"over {limit} lines: " + "; ".join(too_long)
