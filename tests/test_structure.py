"""The codebase keeps its shape: classes of one concern, short functions, every module tested.

Limits from the architecture page (docs/architecture.md), generated code aside:

- no function over 60 lines;
- no class of two concerns: its methods split into components by what they share (LCOM4: two
  methods are joined when one calls the other or both use one attribute of ``self``; attributes
  ``__init__`` builds from one another count as one), and no two components may each be
  :data:`CONCERN_LINES` lines or more. A class may be long when it is one concern; methods are
  never pushed out of the class they belong to to make it shorter;
- no class with more than :data:`MAX_ATTRIBUTES` instance attributes or :data:`MAX_METHODS`
  methods (a god class can be cohesive: everything it does touches everything it has);
- every product module is imported by a test file of its own (``tests/`` or a plugin's tests).

Import layering is checked by import-linter in the lint env.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "src" / "devicehost", *sorted((ROOT / "plugins").glob("*/src"))]
GENERATED = ROOT / "src" / "devicehost" / "proto"
TESTS = [ROOT / "tests", *sorted((ROOT / "plugins").glob("*/tests"))]
MAX_FUNCTION_LINES = 60
CONCERN_LINES = 25
"""Lines of methods that make a component a concern of its own."""
MAX_ATTRIBUTES = 20
MAX_METHODS = 30

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _python_files() -> Iterator[Path]:
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def _trees() -> Iterator[tuple[Path, ast.Module]]:
    for path in _python_files():
        yield path, ast.parse(path.read_text(), str(path))


def _lines(node: ast.AST) -> int:
    assert isinstance(node, ast.stmt)
    return (node.end_lineno or node.lineno) - node.lineno + 1


def _self_attributes(function: Function) -> set[str]:
    """Names read or written as ``self.<name>`` in ``function`` (its first parameter's name)."""
    if not function.args.args:
        return set()
    me = function.args.args[0].arg
    return {
        n.attr
        for n in ast.walk(function)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == me
    }


def _instance_methods(cls: ast.ClassDef) -> dict[str, Function]:
    """The methods that take ``self``: no static or class methods, no ``__init__``."""
    found: dict[str, Function] = {}
    for node in cls.body:
        if isinstance(node, Function) and node.name != "__init__":
            decorators = {ast.unparse(d) for d in node.decorator_list}
            if not decorators & {"staticmethod", "classmethod"}:
                found[node.name] = node
    return found


def _built_from(cls: ast.ClassDef) -> list[tuple[str, str]]:
    """(attribute, attribute) pairs where ``__init__`` builds the first from the second."""
    init = next((n for n in cls.body if isinstance(n, Function) and n.name == "__init__"), None)
    if init is None or not init.args.args:
        return []
    me = init.args.args[0].arg
    pairs = []
    for node in ast.walk(init):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            built = [t.attr for t in targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == me]
            used = {
                n.attr
                for n in ast.walk(node.value)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == me
            }
            pairs += [(b, u) for b in built for u in used]
    return pairs


class _Joined:
    """Union-find over names."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def root(self, name: str) -> str:
        self.parent.setdefault(name, name)
        while self.parent[name] != name:
            name = self.parent[name]
        return name

    def join(self, a: str, b: str) -> None:
        self.parent[self.root(a)] = self.root(b)


def components(cls: ast.ClassDef) -> list[tuple[int, tuple[str, ...]]]:
    """The class's methods grouped by what they share (LCOM4), as (lines, method names), largest first."""
    methods = _instance_methods(cls)
    joined = _Joined()
    for a, b in _built_from(cls):
        joined.join(f".{a}", f".{b}")
    for name, method in methods.items():
        joined.root(name)
        for used in _self_attributes(method):
            joined.join(name, used if used in methods else f".{used}")
    groups: dict[str, list[str]] = {}
    for name in methods:
        groups.setdefault(joined.root(name), []).append(name)
    found = [(sum(_lines(methods[n]) for n in names), tuple(sorted(names))) for names in groups.values()]
    return sorted(found, key=lambda c: (-c[0], c[1]))


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Attributes its methods (``__init__`` included) assign on ``self``."""
    return {
        n.attr
        for f in cls.body
        if isinstance(f, Function) and f.args.args
        for n in ast.walk(f)
        if isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name)
        and n.value.id == f.args.args[0].arg
    }


@dataclass(frozen=True)
class ClassShape:
    where: str
    lines: int
    methods: int
    attributes: int
    components: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def concerns(self) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """The components big enough to be concerns of their own."""
        return tuple(c for c in self.components if c[0] >= CONCERN_LINES)

    def problems(self) -> list[str]:
        found = []
        if len(self.concerns) > 1:
            parts = " | ".join(f"{', '.join(names)} ({lines} lines)" for lines, names in self.concerns)
            found.append(f"{self.where}: {len(self.concerns)} concerns that share nothing: {parts}")
        if self.attributes > MAX_ATTRIBUTES:
            found.append(f"{self.where}: {self.attributes} instance attributes (at most {MAX_ATTRIBUTES})")
        if self.methods > MAX_METHODS:
            found.append(f"{self.where}: {self.methods} methods (at most {MAX_METHODS})")
        return found


def shape(cls: ast.ClassDef, where: str) -> ClassShape:
    methods = sum(isinstance(n, Function) for n in cls.body)
    return ClassShape(where, _lines(cls), methods, len(instance_attributes(cls)), tuple(components(cls)))


def class_shapes(tree: ast.Module, where: str) -> Iterator[ClassShape]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield shape(node, f"{where}:{node.lineno} {node.name}")


def long_functions(tree: ast.Module, where: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, Function) and _lines(node) > MAX_FUNCTION_LINES:
            yield f"{where}:{node.lineno} {node.name} ({_lines(node)} lines)"


def test_the_sources_are_found() -> None:
    files = list(_python_files())
    assert any(p.name == "daemon.py" for p in files)
    assert not any(GENERATED in p.parents for p in files)


def test_no_function_is_too_long_to_read_in_one_sitting() -> None:
    too_long = [line for path, tree in _trees() for line in long_functions(tree, str(path.relative_to(ROOT)))]
    assert not too_long, f"over {MAX_FUNCTION_LINES} lines: " + "; ".join(too_long)


def test_every_class_is_one_concern_of_a_readable_size() -> None:
    shapes = [s for path, tree in _trees() for s in class_shapes(tree, str(path.relative_to(ROOT)))]
    assert len(shapes) > 100
    problems = [p for s in shapes for p in s.problems()]
    assert not problems, "\n".join(problems)


# -- every product module has a test ---------------------------------------------------------


def product_modules() -> dict[str, Path]:
    """Every module of the product and the bundled backends by dotted name, generated code aside."""
    found = {}
    for path in _python_files():
        base = next(s.parent if s.name == "devicehost" else s for s in SOURCES if s in path.parents)
        parts = path.relative_to(base).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(tree: ast.Module) -> set[str]:
    """Dotted names a test file imports, runs (``-m NAME``) or names in a string."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.List | ast.Tuple):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            names.update(f"{w}.__main__" for m, w in itertools.pairwise(words) if m == "-m" and w)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(re.findall(r"\b[a-z_]+(?:\.[a-z_0-9]+)+\b", node.value))
    return names


def _test_files() -> Iterator[Path]:
    """Every test file but this one (which names modules without testing them)."""
    for directory in TESTS:
        for path in sorted(directory.rglob("*.py")):
            if (path.name.startswith("test_") or path.name == "conftest.py") and path != Path(__file__):
                yield path


def untested(modules: dict[str, Path], imported: set[str]) -> list[str]:
    """Modules that no name in ``imported`` is, or is inside (a package counts through its modules)."""
    return sorted(
        m for m in modules if m not in imported and not any(i.startswith(f"{m}.") for i in imported)
    )


def test_every_product_module_is_imported_by_a_test_of_its_own() -> None:
    modules = product_modules()
    assert {"devicehost.host.daemon", "devicehost_example", "devicehost.__main__"} <= set(modules)
    assert not any(m.startswith("devicehost.proto") for m in modules)
    imported = set().union(*(imported_names(ast.parse(p.read_text())) for p in _test_files()))
    missing = untested(modules, imported)
    assert not missing, f"imported by no test file: {missing}"


def test_a_module_no_test_imports_is_named() -> None:
    modules = {"pkg": Path("pkg/__init__.py"), "pkg.used": Path(), "pkg.run": Path(), "pkg.lonely": Path()}
    tree = ast.parse('from pkg.used import thing\nsubprocess.run(["python", "-m", "pkg.run"])\n')
    assert untested(modules, imported_names(tree)) == ["pkg.lonely"]


# -- the class check catches what it is for --------------------------------------------------

TWO_CONCERNS = """
class Both:
    def __init__(self):
        self.sockets = []
        self.cache = dict()

    def open(self):
{open}

    def close(self):
        self.sockets.clear()

    def remember(self, key):
{remember}

    def forget(self, key):
        self.cache.pop(key)
"""
ONE_CONCERN_OVER_PARTS = """
class Facade:
    def __init__(self):
        self.events = []
        self.registry = Registry(self.events)
        self.admission = Admission(self.registry)

    def capacity(self):
{open}

    def allocate(self, key):
{remember}

    def history(self):
        return list(self.events)
"""


def _planted(source: str, first: str = "sockets", second: str = "cache") -> ClassShape:
    """The class in ``source`` with two methods of :data:`CONCERN_LINES` lines each, one using
    ``self.<first>``, the other ``self.<second>``."""
    text = source.format(
        open="\n".join(f"        self.{first}.append({n})" for n in range(CONCERN_LINES)),
        remember="\n".join(f"        self.{second}.setdefault(key, {n})" for n in range(CONCERN_LINES)),
    )
    (cls,) = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)]
    return shape(cls, cls.name)


def test_a_class_of_two_concerns_is_named_with_both() -> None:
    both = _planted(TWO_CONCERNS)
    (problem,) = both.problems()
    assert re.fullmatch(
        r"Both: 2 concerns that share nothing: close, open \(\d+ lines\) \| forget, remember \(\d+ lines\)",
        problem,
    ), problem


def test_a_class_over_parts_it_builds_from_one_another_is_one_concern() -> None:
    facade = _planted(ONE_CONCERN_OVER_PARTS, "registry", "admission")
    assert len(facade.components) == 1, facade.components
    assert facade.problems() == []


def test_a_method_calling_another_joins_its_concern() -> None:
    source = TWO_CONCERNS.replace("self.cache.pop(key)", "self.cache.pop(key)\n        self.close()")
    assert _planted(source).problems() == []


def test_a_class_with_too_much_state_or_too_many_methods_is_named() -> None:
    attributes = "\n".join(f"        self.a{n} = {n}" for n in range(MAX_ATTRIBUTES + 1))
    methods = "\n".join(f"    def m{n}(self):\n        return self.a0" for n in range(MAX_METHODS))
    (cls,) = ast.parse(f"class God:\n    def __init__(self):\n{attributes}\n{methods}\n").body
    assert isinstance(cls, ast.ClassDef)
    assert shape(cls, "God").problems() == [
        f"God: {MAX_ATTRIBUTES + 1} instance attributes (at most {MAX_ATTRIBUTES})",
        f"God: {MAX_METHODS + 1} methods (at most {MAX_METHODS})",
    ]


def test_a_long_function_is_named() -> None:
    body = "\n".join(f"    x = {n}" for n in range(MAX_FUNCTION_LINES))
    assert list(long_functions(ast.parse(f"def long():\n{body}\n"), "m.py")) == [
        f"m.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"
    ]
