"""Meta-tests: every hook spec is documented with its exact signature, and exercised by a test."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devicehost.hookspecs import spec

ROOT = Path(__file__).resolve().parent.parent
HOOKS_DOC = ROOT / "docs" / "hooks.md"
HOOKS = sorted(name for name in vars(spec) if name.startswith("devicehost_"))


def signature_text(name: str) -> str:
    """``def name(arg: type, ...) -> type`` as written in the spec."""
    function: Callable[..., Any] = getattr(spec, name)
    signature = inspect.signature(function)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


def doc_section(name: str) -> str:
    """The text of ``## name`` in docs/hooks.md, up to the next heading."""
    match = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", HOOKS_DOC.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"docs/hooks.md has no '## {name}' section"
    return match.group(1)


def test_the_spec_module_has_hooks() -> None:
    assert "devicehost_allocate" in HOOKS
    assert len(HOOKS) == 8


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_documented_with_its_exact_signature(name: str) -> None:
    section = doc_section(name)
    assert f"```python\n{signature_text(name)}\n```" in section
    firstresult = getattr(spec, name).devicehost_spec["firstresult"]
    assert f"**firstresult**: {'yes' if firstresult else 'no'}" in section
    assert "**Called**" in section
    assert "**Raises**" in section


def test_docs_document_no_hook_that_does_not_exist() -> None:
    documented = re.findall(r"^## (devicehost_\w+)$", HOOKS_DOC.read_text(), re.MULTILINE)
    assert sorted(documented) == HOOKS


def _test_sources() -> dict[Path, str]:
    """Every Python file of the test suites (fakes included), except this one."""
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "plugins").glob("*/tests/**/*.py")]
    return {path: path.read_text() for path in files if path.resolve() != Path(__file__).resolve()}


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_exercised_by_a_test(name: str) -> None:
    users = [path for path, text in _test_sources().items() if re.search(rf"\b{name}\b", text)]
    assert users, f"no test calls or implements {name}"
