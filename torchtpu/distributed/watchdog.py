"""A watchdog for collectives that never finish: a hung rank must not hang the job.

A collective whose peer never joins does not fail on its own: on XLA's CPU
backend the call blocks inside XLA, on TPUs its result never comes.  As
NCCL's watchdog does, each tpu collective is watched from the moment it is
issued until its results are computed; one still running after its group's
timeout is reported (which collective, which group, for how long) and the
process ends, so that torchrun stops the job instead of waiting forever.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time

POLL_SECONDS = 0.5
EXIT_CODE = 6  # NCCL's watchdog aborts (SIGABRT, 6); this exits with the same number, without a core dump


class _Entry:
    __slots__ = ("description", "timeout", "started", "outputs")

    def __init__(self, description: str, timeout: float):
        self.description = description
        self.timeout = timeout
        self.started = time.monotonic()
        self.outputs = None  # None: still being issued (XLA CPU blocks in the call); () once abandoned

    def done(self) -> bool:
        return self.outputs is not None and all(a.is_ready() for a in self.outputs)


# Appended by the issuing threads, trimmed by the watchdog: deque appends need no lock.
_entries: collections.deque = collections.deque()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()


def issued(description: str, timeout_seconds: float) -> _Entry:
    """Start watching a collective; pass the result to ``returned`` when the call returns."""
    entry = _Entry(description, timeout_seconds)
    _entries.append(entry)
    if _thread is None:
        _start()
    return entry


def _start() -> None:
    global _thread
    with _start_lock:
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="torchtpu collective watchdog", daemon=True)
            _thread.start()
            atexit.register(_stop_at_exit)


def _stop_at_exit() -> None:
    """End the thread before the interpreter finalizes: a daemon thread stopped
    there while inside XLA's C++ (an array's ``is_ready``) aborts the process
    ("terminate called ... exception not rethrown") after a clean run."""
    _stop.set()
    _thread.join(timeout=4 * POLL_SECONDS)


def returned(entry: _Entry, outputs) -> None:
    entry.outputs = list(outputs)


def abandon(entry: _Entry) -> None:
    """The call raised: nothing to wait for."""
    entry.outputs = ()


def _watch() -> None:
    while not _stop.wait(POLL_SECONDS):
        while _entries and _entries[0].done():  # collectives finish roughly in the order issued
            _entries.popleft()
        now = time.monotonic()
        late = [e for e in list(_entries) if now - e.started > e.timeout and not e.done()]
        if late:
            _fail(late[0], now)


def _fail(entry: _Entry, now: float) -> None:
    sys.stderr.write(
        f"torchtpu watchdog: {entry.description} has not completed {now - entry.started:.0f} s after it was issued "
        f"(the group's timeout is {entry.timeout:.0f} s): a rank is hung or never joined it. Ending this process, "
        f"as NCCL's watchdog does, so that the launcher stops the job.\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
