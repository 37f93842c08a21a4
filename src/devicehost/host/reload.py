"""A new configuration against the running one: a pure plan of what a reload changes.

Settings that name sockets, servers or the log renderer already in use wait for the next start:
those the config model marks ``NEXT_START`` (:func:`~devicehost.host.config.restart_only_keys`). Backends no longer enabled are withdrawn; newly enabled ones are loaded,
and so are failed ones whose settings changed; loaded ones whose settings changed are configured
again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from devicehost.host.backends.loader import enabled_names
from devicehost.host.config import HostConfig, restart_only_keys


@dataclass(frozen=True)
class ReloadPlan:
    """What applying a new configuration does."""

    config: HostConfig
    """The configuration to run with: the new one, with the restart-only settings kept."""
    deferred: tuple[str, ...] = ()
    """Changed settings that take effect at the next start."""
    disable: tuple[str, ...] = ()
    """Loaded backends to withdraw and close."""
    load: tuple[str, ...] = ()
    """Backends to load and configure."""
    reconfigure: tuple[str, ...] = ()
    """Loaded backends to configure again with their new settings."""
    changed: tuple[str, ...] = ()
    """Every setting that changes now."""


def plan(
    old: HostConfig,
    new: HostConfig,
    *,
    installed: Sequence[str],
    loaded: Collection[str],
    failed: Collection[str],
) -> ReloadPlan:
    """Plan the move from ``old`` to ``new``.

    :param installed: names of the installed backends.
    :param loaded: backends loaded and configured now.
    :param failed: backends that failed to load or whose settings were refused.
    """
    deferred = {
        key: getattr(old, key) for key in restart_only_keys() if getattr(old, key) != getattr(new, key)
    }
    config = new.model_copy(update=deferred) if deferred else new
    wanted = enabled_names(config.enabled_backends, config.disabled_backends, installed)
    before = enabled_names(old.enabled_backends, old.disabled_backends, installed)

    def settings_changed(name: str) -> bool:
        return old.backends.get(name) != config.backends.get(name)

    return ReloadPlan(
        config=config,
        deferred=tuple(sorted(deferred)),
        disable=tuple(n for n in loaded if n not in wanted),
        load=tuple(
            n
            for n in wanted
            if n not in loaded and (n not in before or (n in failed and settings_changed(n)))
        ),
        reconfigure=tuple(n for n in loaded if n in wanted and settings_changed(n)),
        changed=tuple(sorted(k for k in HostConfig.model_fields if getattr(old, k) != getattr(config, k))),
    )
