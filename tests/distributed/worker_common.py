"""What every worker rank shares: its identity, checks that count and report, and the exit."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback

import torch

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
faulthandler.register(signal.SIGUSR1)  # the launcher asks for every thread's stack before it kills a rank


class Checks:
    """Named checks; a failure prints both values and the run continues, so one run reports all."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def _record(self, name: str, ok: bool, detail: str = "") -> None:
        if os.environ.get("WORKER_VERBOSE"):
            print(f"[rank {RANK}] {'ok  ' if ok else 'FAIL'} {name}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(name)
            print(f"[rank {RANK}] FAIL {name}: {detail}", flush=True)

    def equal(self, name: str, got: torch.Tensor, want: torch.Tensor, atol: float = 0.0) -> None:
        """dtype, shape and values; exact unless ``atol`` (bits compared exactly for atol=0)."""
        got = got.detach().cpu()
        if got.dtype != want.dtype or got.shape != want.shape:
            self._record(name, False, f"got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
            return
        if atol == 0.0:
            ok = torch.equal(got, want)
        else:
            ok = torch.allclose(got.double(), want.double(), atol=atol, rtol=0)
        self._record(name, ok, f"got {got.tolist()} want {want.tolist()}")

    def true(self, name: str, condition: bool, detail: str = "") -> None:
        self._record(name, bool(condition), detail)

    def raises(self, name: str, expected, fragments, fn):
        """``fn()`` raises ``expected`` whose message contains every fragment; returns the error."""
        try:
            fn()
        except expected as error:
            missing = [f for f in fragments if f not in str(error)]
            self._record(name, not missing, f"message lacks {missing}: {error}")
            return error
        except Exception as error:  # noqa: BLE001
            self._record(name, False, f"raised {type(error).__name__} instead: {error}")
            return error
        self._record(name, False, "did not raise")
        return None


def finish(checks: Checks) -> None:
    """Print the summary and leave without running atexit hooks: JAX's shutdown barrier
    would wait for every process, including one a fault test killed."""
    print(f"[rank {RANK}] {checks.passed} passed, {len(checks.failed)} failed: {checks.failed}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if checks.failed else 0)


def run(main) -> None:
    checks = Checks()
    try:
        main(checks)
    except BaseException:  # noqa: BLE001 (report, then exit non-zero)
        traceback.print_exc()
        sys.stderr.flush()
        checks.failed.append("uncaught exception")
    finish(checks)
