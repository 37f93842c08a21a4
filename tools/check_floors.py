"""Check that the `min` env really runs at the declared floors.

Every ``name==version`` pin in the constraints file must match the ``name>=version`` floor
declared in setup.cfg (or a bundled backend's setup.cfg), and be the version installed.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def declared_floors() -> dict[str, str]:
    floors: dict[str, str] = {}
    for cfg in [ROOT / "setup.cfg", *sorted(ROOT.glob("plugins/*/setup.cfg"))]:
        parser = configparser.ConfigParser()
        parser.read(cfg)
        for line in parser.get("options", "install_requires", fallback="").splitlines():
            match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)\s*", line)
            if match:
                floors[match[1].lower()] = match[2]
    return floors


def main(constraints: str) -> int:
    floors = declared_floors()
    problems = []
    pins = {}
    for line in Path(constraints).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    for name, floor in floors.items():
        if pins.get(name) != floor:
            problems.append(f"{name}: setup.cfg floor {floor}, {constraints} pins {pins.get(name)}")
        else:
            installed = importlib.metadata.version(name)
            if installed != floor:
                problems.append(f"{name}: floor {floor}, installed {installed}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{len(floors)} dependencies installed at their declared floors")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
