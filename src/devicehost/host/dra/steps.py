"""The named steps of preparing and unpreparing a claim, and a test seam that kills the host at one.

A host can die at any point of a kubelet call (a backend written in C takes the process down,
the node loses power). The checkpoint keeps each claim's phase so the next start replays from
there (see :mod:`.claims` and :mod:`.restore`). To prove it, a test sets ``DEVICEHOST_KILL_AT``
to one of :data:`STEPS` in the host's environment: the host kills itself with SIGKILL (no
cleanup, as a crash) the first time it reaches that step. Unset, each step costs one lookup.
"""

from __future__ import annotations

import os
import signal

import structlog

log = structlog.get_logger(__name__)

KILL_ENV = "DEVICEHOST_KILL_AT"

PREPARE_RECORDED = "prepare-recorded"
"""The claim is in the checkpoint as ``preparing``; its allocate hooks have not run."""
PREPARE_ALLOCATED = "prepare-allocated"
"""The allocate hooks ran; the claim's CDI spec is not written."""
PREPARE_SPEC_WRITTEN = "prepare-spec-written"
"""The CDI spec is written; the checkpoint still says ``preparing``."""
PREPARE_CHECKPOINTED = "prepare-checkpointed"
"""The checkpoint says ``prepared``; the kubelet has no answer yet."""
UNPREPARE_RECORDED = "unprepare-recorded"
"""The claim is in the checkpoint as ``unpreparing``; its release hooks have not run."""
UNPREPARE_RELEASED = "unprepare-released"
"""The release hooks ran and the checkpoint says ``released``; the CDI spec is still there."""
UNPREPARE_SPEC_REMOVED = "unprepare-spec-removed"
"""The CDI spec is gone; the checkpoint still has the claim."""
UNPREPARE_CHECKPOINTED = "unprepare-checkpointed"
"""The checkpoint no longer has the claim; the kubelet has no answer yet."""

STEPS = (
    PREPARE_RECORDED,
    PREPARE_ALLOCATED,
    PREPARE_SPEC_WRITTEN,
    PREPARE_CHECKPOINTED,
    UNPREPARE_RECORDED,
    UNPREPARE_RELEASED,
    UNPREPARE_SPEC_REMOVED,
    UNPREPARE_CHECKPOINTED,
)


def reached(step: str) -> None:
    """The host reached ``step``: killed here when ``DEVICEHOST_KILL_AT`` names it."""
    if os.environ.get(KILL_ENV) == step:
        log.warning("killed at a step, as asked", step=step, env=KILL_ENV)
        os.kill(os.getpid(), signal.SIGKILL)
