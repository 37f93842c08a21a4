"""Logging: structlog for our lines, the same renderer for stdlib loggers (grpc, stevedore).

JSON lines when the output is not a terminal (a DaemonSet pod), readable console lines on one.
Our own lines take structlog's fast path (a filtering bound logger writing straight to the
stream: a line below the level costs nothing, one above it never goes through stdlib logging);
stdlib loggers go through ``ProcessorFormatter`` with the same processors and renderer.
Context bound with ``structlog.contextvars`` (``resource=``, ``backend=``) is merged first, so
it reaches every line, including those logged from hook threads.

gRPC's C-core writes its own lines (``I1123 09:19:04.182047 2531 chttp2_transport.cc:1403] ...``)
straight to fd 2, below Python. For the process's own log (JSON off a terminal), fd 2 becomes a
pipe whose lines are logged as ``logger=grpc-core`` lines (anything else native code writes
there as ``logger=stderr`` errors; Python's ``sys.stderr`` keeps the real stderr), and C-core is told to say only errors unless ``GRPC_VERBOSITY`` or
``GRPC_TRACE`` ask for more. Those two also let gRPC's and asyncio's Python debug chatter (``Loaded
running loop``) through at ``--log-level debug``; without them it stays out.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
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


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,  # not a config choice: commands that say it all themselves
}


_CHATTY = ("grpc", "asyncio")
"""Stdlib loggers whose debug lines are gRPC's internals, not the host's story."""
_NATIVE_LINE = re.compile(r"^(?P<severity>[DIWEF])\d{4} [\d:.]+\s+\d+ (?P<source>[^\]]+)\] ?(?P<message>.*)$")
_NATIVE_LEVELS = {
    "D": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
_native_reader: threading.Thread | None = None


def quiet_grpc_core() -> None:
    """Ask gRPC C-core for errors only, unless the user set ``GRPC_VERBOSITY`` themselves.

    C-core reads the variable once, when grpc is first imported: call this before anything
    imports grpc (``devicehost``'s ``main`` does, first thing after parsing). Set later, C-core
    keeps its own default and its INFO lines (``chttp2_transport.cc:1403] ... Got goaway`` at
    every kubelet restart) reach the log.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def grpc_debug_asked() -> bool:
    """Whether the user asked gRPC for more than errors (``GRPC_VERBOSITY``/``GRPC_TRACE``)."""
    verbosity = os.environ.get("GRPC_VERBOSITY", "").upper()
    return verbosity in ("DEBUG", "INFO") or bool(os.environ.get("GRPC_TRACE"))


def configure_logging(level: str = "info", log_format: str = "auto", stream: TextIO | None = None) -> None:
    """Send every log line, ours and the stdlib's, through one structlog renderer to ``stream``.

    Without ``stream`` this is the process's own log on stdout: C-core's lines on fd 2 join it
    as JSON lines too when the log is JSON.
    """
    process_log = stream is None
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
    for name in _CHATTY:
        logging.getLogger(name).setLevel(
            logging.NOTSET if grpc_debug_asked() else max(_LEVELS[level], logging.INFO)
        )
    if process_log and as_json:
        route_native_stderr()


def route_native_stderr() -> None:
    """Make fd 2 a pipe whose lines are logged (JSON, like every other line); once per process.

    Only native code writes to fd 2 then (gRPC C-core): ``sys.stderr`` moves to a copy of it.

    gRPC reads ``GRPC_VERBOSITY`` when it starts: unless the user set it, only errors are asked for.
    """
    global _native_reader
    quiet_grpc_core()  # in time only if grpc is not imported yet; main() has done it before that
    if _native_reader is not None:
        return
    read_end, write_end = os.pipe()
    # Python's own stderr (a user error's one line, a traceback) keeps the real fd 2.
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    os.dup2(write_end, 2)
    os.close(write_end)
    _native_reader = threading.Thread(
        target=log_native_lines, args=(read_end,), name="native stderr", daemon=True
    )
    _native_reader.start()
    atexit.register(drain_native_stderr)


def drain_native_stderr(timeout: float = 1.0) -> None:
    """Close fd 2 and let the reader log what is left in the pipe (before the process leaves)."""
    global _native_reader
    reader, _native_reader = _native_reader, None
    if reader is None:
        return  # never routed, or drained already (fd 2 may be another file by now)
    with contextlib.suppress(OSError):
        os.close(2)
    reader.join(timeout)


def log_native_lines(read_end: int) -> None:
    """Log each line written to fd 2 until every writer closed it."""
    core = logging.getLogger("grpc-core")
    other = logging.getLogger("stderr")
    with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as pipe:
        for raw in pipe:
            line = raw.rstrip("\n")
            match = _NATIVE_LINE.match(line)
            if match is not None:
                level = _NATIVE_LEVELS[match["severity"]]
                core.log(level, "%s [%s]", match["message"], match["source"])
            elif line.strip():
                other.error(line)
