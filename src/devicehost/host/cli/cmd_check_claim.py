"""``devicehost check-claim FILE...``: the admission webhook's check of DRA claim configuration,
offline: no cluster, no TLS.

Each file holds ResourceClaims and ResourceClaimTemplates (YAML, several documents each, as
``kubectl apply -f`` takes them). The backends the host's config allows are loaded and discovered
once to learn their DRA drivers, as ``devicehost webhook`` does (``--driver BACKEND=DRIVER`` names
more), and each ``opaque`` configuration for one of those drivers is checked by the backend's
claim config model. One line per refused configuration; exit 1 when any is refused, 2 when a
file cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicehost.host.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailed,
    add_config_options,
    checked_config,
    set_handler,
)

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig
    from devicehost.host.webhook.review import ConfigChecker


def add_parser(commands: Commands) -> None:
    check = commands.add_parser(
        "check-claim",
        help="check the DRA configuration of ResourceClaim(Template) files against the backends' models",
    )
    check.add_argument("files", type=Path, nargs="+", metavar="FILE", help="YAML or JSON manifests")
    check.add_argument(
        "--driver",
        action="append",
        default=[],
        dest="named_drivers",
        metavar="BACKEND=DRIVER",
        help="also check DRA driver DRIVER's configuration with BACKEND's model, whatever its "
        "discovery finds (as `devicehost webhook --driver`); repeatable",
    )
    add_config_options(check)
    set_handler(check, check_claim_command, load_config=checked_config)


def claims(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each ResourceClaim and ResourceClaimTemplate of the file, as ``Kind namespace/name``.

    :raises CommandFailed: the file cannot be read or parsed (exit 2).
    """
    import yaml

    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CommandFailed(f"{path}: cannot read: {' '.join(str(exc).split())}", EXIT_USAGE) from None
    for document in documents:
        items = (
            document.get("items", ())
            if isinstance(document, dict) and document.get("kind") == "List"
            else [document]
        )
        for item in items:
            if isinstance(item, dict) and str(item.get("apiVersion", "")).startswith("resource.k8s.io/"):
                meta = item.get("metadata") or {}
                name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
                yield f"{item.get('kind')} {name}", item


def check_file(path: Path, checkers: Mapping[str, ConfigChecker]) -> tuple[list[str], int]:
    """The refusal lines of one file, and how many claims it holds."""
    from devicehost.host.webhook.review import SPEC_PATHS, config_problems

    lines, count = [], 0
    for what, item in claims(path):
        kind = what.split(" ", 1)[0]
        if kind not in SPEC_PATHS:
            continue
        count += 1
        spec: Any = item
        for key in SPEC_PATHS[kind]:
            spec = spec.get(key) if isinstance(spec, dict) else None
        refusals, _ = config_problems(spec, ".".join(SPEC_PATHS[kind]), checkers)
        lines += [f"{path}: {what}: {refusal}" for refusal in refusals]
    return lines, count


def check_claim_command(args: argparse.Namespace, config: HostConfig) -> int:
    """Load and discover the backends once, then check every file: one line per refusal."""
    import asyncio

    from devicehost.host.logs import configure_logging
    from devicehost.host.webhook.drivers import build_table, parse_named_drivers

    try:
        named = parse_named_drivers(args.named_drivers)
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
    configure_logging("critical", config.log_format, sys.stderr)  # problems are said below, once
    table = asyncio.run(build_table(config, named))
    try:
        for problem in table.problems:
            print(f"devicehost: {problem}", file=sys.stderr)
        checked = [(path, *check_file(path, table.backends)) for path in args.files]
    finally:
        table.close()
    refused = [line for _, lines, _ in checked for line in lines]
    for line in refused:
        print(line)
    drivers = ", ".join(f"{d} ({b})" for d, b in table.describe().items()) or "none"
    for path, lines, count in checked:
        if not lines:
            print(f"{path}: {count} claims checked, valid (drivers checked: {drivers})")
    return EXIT_FAILED if refused else EXIT_OK
