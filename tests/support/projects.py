"""Backend projects written by a test (the docs' walk-through, the scaffold), run as a vendor would."""

from __future__ import annotations

import configparser
import shlex
import subprocess
from pathlib import Path


def tox_commands(tox_ini: str) -> list[list[str]]:
    """The ``[testenv] commands`` of a project's tox.ini, split into words."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(tox_ini)
    return [shlex.split(line) for line in parser["testenv"]["commands"].strip().splitlines()]


def run_testenv(venv: Path, project: Path, tox_ini: str, timeout: float) -> list[str]:
    """Run the project's tox commands with ``venv``'s programs; each must pass. Their outputs."""
    outputs = []
    for command in tox_commands(tox_ini):
        result = subprocess.run(
            [str(venv / "bin" / command[0]), *command[1:]],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert " passed" in result.stdout
        assert "failed" not in result.stdout
        outputs.append(result.stdout)
    return outputs
