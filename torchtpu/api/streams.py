"""Streams and events with CUDA's API.

XLA orders a device's work itself, so a stream is an ordering handle: work on
every stream runs in dispatch order, which is a valid schedule for any CUDA
stream program, waits are no-ops, and synchronize waits for all.
"""

from __future__ import annotations

import threading
import time

import torch

from ..core import tensor
from ..runtime import context
from ..runtime.device import index_of as _index
from .device import synchronize

class Stream:
    """XLA orders a device's work itself; a stream is an ordering handle with CUDA's API.

    Work on every stream runs in dispatch order, which is a valid schedule for
    any CUDA stream program, so waits are no-ops and synchronize waits for all.
    """

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()
        return False

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<torch.tpu.Stream device={self.device} priority={self.priority}>"


_default_stream = None
_per_thread = threading.local()  # the current-stream stack is per thread, as CUDA's is


def _stack() -> list:
    stack = getattr(_per_thread, "stack", None)
    if stack is None:
        stack = _per_thread.stack = []
    return stack



def default_stream(device=None) -> Stream:
    global _default_stream
    _index(device)
    if _default_stream is None:
        _default_stream = Stream()
    return _default_stream


def current_stream(device=None) -> Stream:
    _index(device)
    stack = _stack()
    return stack[-1] if stack else default_stream()


def set_stream(s) -> None:
    """Make ``s`` the current stream (until the enclosing ``stream`` block ends)."""
    stack = _stack()
    if stack:
        stack[-1] = s
    else:
        stack.append(s)


class StreamContext:
    """``with StreamContext(s):`` makes ``s`` the current stream inside the block (``torch.cuda.StreamContext``).

    ``None`` leaves the current stream as it is."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            _stack().append(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            _stack().pop()
        return False


def stream(s) -> StreamContext:
    """Make ``s`` the current stream inside the block, like ``torch.cuda.stream``."""
    return StreamContext(s)


class Event:
    """A point in the device's queue, with CUDA's API: synchronize waits for the work queued before
    ``record`` (not for work queued after it, so the host can run ahead by a step)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._time = None
        self._point = None

    def record(self, stream=None) -> None:
        # A timing event needs the time the preceding work finished: wait for it.
        if self.enable_timing:
            synchronize()
        context.current().flush("event record")
        self._point = tensor.SyncPoint()
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        if self._point is not None:
            self._point.wait()

    def query(self) -> bool:
        return self._point is None or self._point.ready()

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event and ``end_event``, as CUDA reports."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0
