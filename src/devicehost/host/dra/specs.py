"""Each prepared claim's CDI spec (``<driver>/claim-<uid>``) in the host's live ``cdi_dir``.

:class:`ClaimSpecs` writes and removes them where the host context says now, and after a
reload that changed ``cdi_dir`` moves those of the prepared claims there, so a container
started again finds its claim's devices where the runtime reads now.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.host.dra import names

if TYPE_CHECKING:
    from devicehost.host.context import HostContext


class ClaimSpecs:
    """One driver's claim specs; ``context`` None: ``devicehost.cdi``'s default dir."""

    def __init__(
        self, driver: str, context: HostContext | None, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        self._driver = driver
        self._context = context
        self._log = log
        self._where = self.directory
        """Where the prepared claims' specs are: the dir they were last written or moved to."""

    @property
    def directory(self) -> Path | None:
        """Where a claim's spec goes now: the host's live ``cdi_dir``."""
        return None if self._context is None else self._context.config.cdi_dir

    def kind(self, uid: str) -> str:
        return names.cdi_kind(self._driver, uid)

    def write(self, uid: str, devices: list[cdi.Device]) -> None:
        """Write the claim's spec. :raises OSError, ValueError: it could not be written."""
        cdi.write_spec(cdi.Spec(kind=self.kind(uid), devices=devices), self.directory)

    def remove(self, uid: str) -> None:
        """Remove the claim's spec (none there: nothing happens)."""
        cdi.remove_spec(self.kind(uid), self.directory)

    def follow(self, prepared: Iterable[str]) -> None:
        """Move the specs of the ``prepared`` claims (UIDs) to ``cdi_dir`` if it changed since."""
        source, target = self._where, self.directory
        if source is None or target is None or source == target:
            return
        for uid in prepared:
            try:
                cdi.move_spec(self.kind(uid), source, target)
            except (OSError, ValueError) as exc:
                self._log.error("claim's CDI spec not moved to the new cdi_dir", uid=uid, error=str(exc))
        self._where = target
        self._log.info("prepared claims' CDI specs moved", source=str(source), target=str(target))
