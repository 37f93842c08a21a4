"""Logging: structlog for our lines, the same renderer for stdlib loggers (grpc, stevedore).

JSON lines when the output is not a terminal (a DaemonSet pod), readable console lines on one.
Our own lines take structlog's fast path (a filtering bound logger writing straight to the
stream: a line below the level costs nothing, one above it never goes through stdlib logging);
stdlib loggers go through ``ProcessorFormatter`` with the same processors and renderer.
Context bound with ``structlog.contextvars`` (``resource=``, ``backend=``) is merged first, so
it reaches every line, including those logged from hook threads.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TextIO

import structlog


class _SafeWriteLogger(structlog.WriteLogger):
    """structlog's WriteLogger, except that a broken or closed stream drops the line.

    Our lines are written by the calling code itself (no logging.Handler to catch errors): an
    EPIPE on stdout must not turn a signal handler or a resource's loop into a crash.
    """

    def msg(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().msg(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", log_format: str = "auto", stream: TextIO | None = None) -> None:
    """Send every log line, ours and the stdlib's, through one structlog renderer to ``stream``."""
    stream = sys.stdout if stream is None else stream
    as_json = log_format == "json" or (log_format == "auto" and not stream.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    tracebacks: list[structlog.typing.Processor] = [structlog.processors.dict_tracebacks] if as_json else []
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *tracebacks, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *_: _SafeWriteLogger(stream),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tracebacks, renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
