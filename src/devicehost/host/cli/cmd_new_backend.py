"""``devicehost new-backend``: write a complete backend project, ready to install and test.

The files come from the templates in ``backend_template/`` (package data, read with
importlib.resources): ``${...}`` placeholders are filled in, ``__module__`` in a path becomes the
backend's module, and ``.tmpl`` is dropped. Unchanged, the project installs, is listed by
``devicehost backends``, passes the conformance suite and its own tests.
"""

from __future__ import annotations

import argparse
import re
import string
from dataclasses import asdict, dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING

from devicehost.host.cli.common import EXIT_OK, EXIT_USAGE, CommandFailed, set_handler

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig

NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
MAX_NAME_LENGTH = 40
TEMPLATE_DIR = "backend_template"
RENAMES = {"gitignore": ".gitignore"}
"""Template files whose name would be hidden or picked up by tools inside the package."""


@dataclass(frozen=True)
class Names:
    """Everything the templates name, derived from the backend name and its resource."""

    name: str
    resource: str
    distribution: str
    module: str
    class_name: str
    short: str
    env: str
    pin: str


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "new-backend", help="write a new backend project (packaging, hooks, tests, tox.ini, README)"
    )
    parser.add_argument("name", metavar="NAME", help="the backend's entry-point name, such as acme")
    parser.add_argument(
        "--resource", required=True, metavar="DOMAIN/NAME", help="the extended resource it offers"
    )
    parser.add_argument(
        "--dir", type=Path, metavar="DIR", help="where to write it (default ./devicehost-NAME); new or empty"
    )
    set_handler(parser, new_backend_command, load_config=_no_config)


def _no_config(args: argparse.Namespace) -> HostConfig:
    """The command reads no configuration: the defaults, whatever the environment says."""
    from devicehost.host.config import HostConfig

    return HostConfig.model_validate({})


def names_for(name: str, resource: str) -> Names:
    """The derived names; CommandFailed (usage) naming the rule a bad name or resource breaks."""
    from devicehost import __version__
    from devicehost.hookspecs.rules import resource_name_problem

    if not NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise CommandFailed(
            f"new-backend: backend name {name!r} must be lowercase letters and digits, with single"
            f" '-' or '_' between them, starting with a letter, at most {MAX_NAME_LENGTH} characters",
            EXIT_USAGE,
        )
    problem = resource_name_problem(resource)
    if problem:
        raise CommandFailed(f"new-backend: --resource: {problem}", EXIT_USAGE)
    snake = name.replace("-", "_")
    major, minor = (int(part) for part in re.findall(r"\d+", __version__)[:2])
    # semver: before 1.0 a minor release may break the API (docs/stability.md), from 1.0 a major one
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return Names(
        name=name,
        resource=resource,
        distribution=f"devicehost-{name}",
        module=f"devicehost_{snake}",
        class_name="".join(part.capitalize() for part in snake.split("_")) + "Backend",
        short=resource.split("/")[1][:40],
        env=f"{snake.upper()}_DEVICES",
        pin=f">={major}.{minor},<{upper}",
    )


def render(names: Names) -> dict[Path, str]:
    """Every file of the project, by path relative to its root."""
    files: dict[Path, str] = {}
    root = resources.files("devicehost.host.cli") / TEMPLATE_DIR
    for relative, template in _walk(root, Path()):
        target = Path(*(part.replace("__module__", names.module) for part in relative.parts))
        target = target.with_name(
            RENAMES.get(target.name.removesuffix(".tmpl"), target.name.removesuffix(".tmpl"))
        )
        files[target] = string.Template(template.read_text(encoding="utf-8")).substitute(asdict(names))
    return files


def _walk(directory: Traversable, relative: Path) -> list[tuple[Path, Traversable]]:
    found = []
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            found += _walk(entry, relative / entry.name)
        elif entry.name.endswith(".tmpl"):
            found.append((relative / entry.name, entry))
    return found


def new_backend_command(args: argparse.Namespace, config: HostConfig) -> int:
    """Write the project; usage errors (2) for a bad name or resource, or a directory in use."""
    names = names_for(args.name, args.resource)
    target: Path = args.dir if args.dir is not None else Path.cwd() / names.distribution
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CommandFailed(
            f"new-backend: {target} already exists and is not an empty directory; choose another --dir",
            EXIT_USAGE,
        )
    files = render(names)
    for path, text in files.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text, encoding="utf-8")
    print(f"wrote backend {names.name!r} ({names.resource}) to {target}:")
    for path in sorted(files):
        print(f"    {path}")
    print(
        "next: put a devicehost wheel in wheels/ (see its README), then"
        f" `pip install --find-links wheels -e '{target}[testing]'` and run the tests in its README"
    )
    return EXIT_OK
