"""A watchdog for collectives that never finish: a hung rank must not hang the job.

A collective whose peer never joins does not fail on its own: on XLA's CPU
backend the call blocks inside XLA, on TPUs its result never comes.  As
NCCL's watchdog does, each tpu collective is watched from the moment it is
issued until its results are computed; one still running after its group's
timeout is reported (which collective, which group, for how long) and the
process ends, so that torchrun stops the job instead of waiting forever.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

POLL_SECONDS = 0.5
EXIT_CODE = 6  # NCCL's watchdog aborts (SIGABRT, 6); this exits with the same number, without a core dump


@dataclasses.dataclass
class _Entry:
    description: str
    timeout: float
    started: float
    outputs: list | None = None  # None: still being issued (XLA CPU blocks in the call)

    def done(self) -> bool:
        return self.outputs is not None and all(a.is_ready() for a in self.outputs)


_lock = threading.Lock()
_entries: list[_Entry] = []
_thread: threading.Thread | None = None


def issued(description: str, timeout_seconds: float) -> _Entry:
    """Start watching a collective; pass the result to ``returned`` when the call returns."""
    global _thread
    entry = _Entry(description, timeout_seconds, time.monotonic())
    with _lock:
        _entries.append(entry)
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="torchtpu collective watchdog", daemon=True)
            _thread.start()
    return entry


def returned(entry: _Entry, outputs) -> None:
    entry.outputs = list(outputs)


def abandon(entry: _Entry) -> None:
    """The call raised: nothing to wait for."""
    with _lock:
        if entry in _entries:
            _entries.remove(entry)


def _watch() -> None:
    while True:
        time.sleep(POLL_SECONDS)
        now = time.monotonic()
        with _lock:
            _entries[:] = [e for e in _entries if not e.done()]
            late = [e for e in _entries if now - e.started > e.timeout]
        if late:
            _fail(late[0], now)


def _fail(entry: _Entry, now: float) -> None:
    sys.stderr.write(
        f"torchtpu watchdog: {entry.description} has not completed {now - entry.started:.0f} s after it was issued "
        f"(the group's timeout is {entry.timeout:.0f} s): a rank is hung or never joined it. Ending this process, "
        f"as NCCL's watchdog does, so that the launcher stops the job.\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
