"""A backend's own threads: at most ``MAX_THREADS_PER_BACKEND`` hook calls at once, each with a deadline:
the caller's seconds (the host's ``hook_timeout``), or the bound the call's resource declared for the hook.

The hand-off is one ``submit`` and one ``call_soon_threadsafe`` back: the answer lands in a loop
future of our own, which a timer fails at the deadline. Nothing but us holds that future, so a
caller that gives up (cancelled, timed out) never touches the thread, and a hung hook keeps its
thread (and its slot) until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MAX_THREADS_PER_BACKEND = 8


class Expired(Exception):
    """The call passed its deadline (a hook's own ``TimeoutError`` stays its own); the text is its
    bound (``10 s``)."""


class NoThread(Exception):
    """Every thread is taken by calls that have not returned, until the deadline."""


class Closed(Exception):
    """The threads were let go: the backend is closed."""


class HookThreads:
    """Runs hook callables in a backend's own threads, with the caller's contextvars."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(MAX_THREADS_PER_BACKEND, thread_name_prefix=f"backend-{name}")
        self.running: dict[int, tuple[str, float, float]] = {}
        """Calls whose thread has not come back: hook name, when it started, and its seconds."""
        self._slots = asyncio.Semaphore(MAX_THREADS_PER_BACKEND)
        """Calls wait for a free thread (within their deadline) instead of queueing in the pool."""
        self._call_ids = itertools.count()
        self.bounds: dict[tuple[str, str], float] = {}
        """Seconds by (hook, resource) that a call for that resource takes instead of the caller's."""

    def stuck(self) -> list[str]:
        """Hooks still running past their own deadline."""
        now = time.monotonic()
        return [hook for hook, started, seconds in list(self.running.values()) if started + seconds < now]

    async def call(
        self, hook: str, caller: Callable[..., Any], kwargs: dict[str, Any], seconds: float
    ) -> Any:
        """``caller(**kwargs)`` in a thread; its answer, or what it raised.

        ``seconds`` is the call's bound, unless :attr:`bounds` has one for ``hook`` and
        ``kwargs["resource"]``.

        :raises NoThread: no thread freed up within the bound.
        :raises Expired: the call did not return within the bound (waiting for a thread included).
        :raises Closed: the threads were let go.
        """
        seconds = self.bounds.get((hook, kwargs.get("resource", "")), seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        if self._slots.locked():  # only then can acquiring wait: bound the wait
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                raise NoThread(
                    f"not called: {len(self.running)} earlier hook calls have not returned"
                ) from None
        else:
            await self._slots.acquire()
        call_id = next(self._call_ids)
        self.running[call_id] = (hook, time.monotonic(), seconds)
        answer = loop.create_future()
        timer = loop.call_at(deadline, _expire, answer, seconds)
        try:
            context = contextvars.copy_context()
            self._executor.submit(_run, loop, self._settle, answer, call_id, context, caller, kwargs)
        except RuntimeError:  # the pool was shut down
            timer.cancel()
            self._settle(answer, call_id, None, None)
            raise Closed("not called: the backend is closed") from None
        try:
            return await answer
        finally:
            timer.cancel()

    def _settle(
        self, answer: asyncio.Future[Any], call_id: int, result: Any, error: BaseException | None
    ) -> None:
        """On the loop: the thread is free again; the answer goes to the caller if it still waits."""
        self.running.pop(call_id, None)
        self._slots.release()
        if answer.done():
            return
        if error is None:
            answer.set_result(result)
        elif isinstance(error, Exception) and not isinstance(error, StopIteration):
            answer.set_exception(error)
        else:  # SystemExit, KeyboardInterrupt or StopIteration: a future cannot carry them
            answer.set_exception(RuntimeError(f"{type(error).__name__}: {error}"))

    def close(self) -> None:
        """Let the threads go; hung ones finish in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _expire(answer: asyncio.Future[Any], seconds: float) -> None:
    if not answer.done():
        answer.set_exception(Expired(f"{seconds:g} s"))


def _run(
    loop: asyncio.AbstractEventLoop,
    settle: Callable[[asyncio.Future[Any], int, Any, BaseException | None], None],
    answer: asyncio.Future[Any],
    call_id: int,
    context: contextvars.Context,
    caller: Callable[..., Any],
    kwargs: dict[str, Any],
) -> None:
    """In a backend thread: the hook, in the caller's context; its outcome goes back to the loop."""
    result: Any = None
    error: BaseException | None = None
    try:
        result = context.run(caller, **kwargs)
    except BaseException as exc:  # the loop side decides what it means
        error = exc
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle, answer, call_id, result, error)
