"""tox's inline plugin for this checkout: where interpreters are found, and what a missing one does.

Interpreters: pyenv's (``$PYENV_ROOT`` or ``~/.pyenv``, through virtualenv-pyenv, falling back to
PATH) when pyenv has a ``versions`` dir; otherwise PATH alone (virtualenv's builtin discovery),
because virtualenv-pyenv stops tox with ``PathError: pyenv root does not exist`` where there is no
pyenv. A ``VIRTUALENV_DISCOVERY`` already in the environment is left as it is.

A missing interpreter: on a developer's machine its envs are skipped and named, with the reason
(``tox.ini`` sets ``skip_missing_interpreters = true``); on CI (``CI`` set to anything but
``false``/``0``/empty) it fails the run, so CI never passes by testing less. An explicit
``--skip-missing-interpreters`` on the command line wins over both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tox.plugin import impl

if TYPE_CHECKING:
    from tox.config.sets import ConfigSet
    from tox.session.state import State

DISCOVERY = "VIRTUALENV_DISCOVERY"


def pyenv_versions() -> Path:
    """Where virtualenv-pyenv looks for interpreters."""
    root = os.environ.get("PYENV_ROOT")
    return (Path(root) if root else Path.home() / ".pyenv") / "versions"


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def discovery() -> tuple[str, str]:
    """(the virtualenv discovery to use, where it looks)."""
    if os.environ.get(DISCOVERY):
        return os.environ[DISCOVERY], f"{DISCOVERY}={os.environ[DISCOVERY]} from the environment"
    versions = pyenv_versions()
    if versions.is_dir():
        return "pyenv-fallback", f"pyenv's interpreters in {versions}, then PATH"
    return "builtin", f"PATH only (no pyenv: {versions} does not exist)"


_said = False


@impl
def tox_add_core_config(core_conf: ConfigSet, state: State) -> None:
    global _said
    how, where = discovery()
    os.environ[DISCOVERY] = how  # tox passes VIRTUALENV_* on to virtualenv (pass_env default)
    options = state.conf.options
    ci = on_ci()
    if ci and getattr(options, "skip_missing_interpreters", "config") == "config":
        options.skip_missing_interpreters = "false"
    if not _said:
        _said = True
        missing = "fail the run (CI is set)" if ci else "are skipped, each named with the reason"
        if getattr(options, "skip_missing_interpreters", "config") == "false" and not ci:
            missing = "fail the run (--skip-missing-interpreters false)"
        print(f"devicehost: interpreters from {where}; missing ones {missing}", flush=True)
