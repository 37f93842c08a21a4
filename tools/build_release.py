"""Build the sdist and wheel of devicehost and of every bundled plugin, then ``twine check --strict``.

Usage: ``python tools/build_release.py OUTDIR`` (the tox env ``release``). Exits non-zero, naming
the distribution, when a build or the check fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = [ROOT, *sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())]


def main(outdir: Path) -> int:
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.iterdir():
        old.unlink()
    for project in PROJECTS:
        # The plugins need devicehost at run time only: builds are isolated and need no index for it.
        built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(outdir), str(project)])
        if built.returncode != 0:
            print(f"build_release: building {project.relative_to(ROOT.parent)} failed", file=sys.stderr)
            return 1
    dists = sorted(str(p) for p in outdir.iterdir())
    expected = 2 * len(PROJECTS)
    if len(dists) != expected:
        print(f"build_release: expected {expected} files (sdist + wheel each), got {dists}", file=sys.stderr)
        return 1
    return subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *dists]).returncode


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
