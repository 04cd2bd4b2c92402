"""Start N worker processes as torchrun would, and collect what each one did.

Each rank is a new session (``start_new_session=True``), so a timeout or a
failed rank kills the whole process group of every child, JAX's threads and
anything they started included.  Output goes to files, not pipes: a chatty
rank can never block on a full pipe.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: killed before it ended (see ``killed``)
    stdout: str
    stderr: str
    killed: str = ""  # why the launcher killed it, if it did


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], nprocs: int, timeout: float, env: dict | None = None,
           grace: float = 10.0, kill_when: Callable[[], bool] | None = None) -> list[RankResult]:
    """Run ``python *argv`` as ranks 0..nprocs-1 on this host.

    Stops every rank when ``timeout`` seconds have passed, or ``grace``
    seconds after one rank failed (time for the others to report their own
    error first). ``kill_when``, polled while they run, SIGKILLs every rank
    the moment it holds, as a crashed host would.
    """
    port = free_port()
    base = dict(os.environ, **(env or {}))
    base["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, REPO, base.get("PYTHONPATH", "")) if p)
    procs, outputs = [], []
    for rank in range(nprocs):
        rank_env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nprocs))
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        outputs.append((out, err))
        procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, stdout=out, stderr=err,
                                      cwd=REPO, start_new_session=True))
    killed = _supervise(procs, timeout, grace, kill_when)
    results = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        out.seek(0)
        err.seek(0)
        results.append(RankResult(rank, None if killed.get(rank) else proc.returncode, out.read(), err.read(),
                                  killed.get(rank, "")))
        out.close()
        err.close()
    return results


def _supervise(procs, timeout: float, grace: float, kill_when) -> dict[int, str]:
    """Wait for the ranks; kill the survivors on timeout, after a failure or when ``kill_when``
    holds. rank -> why killed."""
    deadline = time.monotonic() + timeout
    reason = f"timeout after {timeout:.0f} s"
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return {}
        if kill_when is not None and kill_when():
            return _kill(procs, _still_running(procs, "kill_when held"))
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            deadline = min(deadline, time.monotonic() + grace)
            reason = f"rank {failed[0]} failed (exit code {codes[failed[0]]})"
        time.sleep(0.2)
    killed = _still_running(procs, reason)
    for rank in killed:
        _signal(procs[rank], signal.SIGUSR1)  # workers dump every thread's stack on it (faulthandler)
    time.sleep(2 if killed else 0)
    return _kill(procs, killed)


def _still_running(procs, reason: str) -> dict[int, str]:
    return {rank: reason for rank, proc in enumerate(procs) if proc.poll() is None}


def _kill(procs, killed: dict[int, str]) -> dict[int, str]:
    for rank in killed:
        _signal(procs[rank], signal.SIGKILL, group=True)
        procs[rank].wait()
    return killed


def _signal(proc, signum, group: bool = False) -> None:
    try:
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass


def report(results: list[RankResult]) -> str:
    parts = []
    for r in results:
        status = f"killed ({r.killed})" if r.killed else f"exit code {r.returncode}"
        parts.append(f"===== rank {r.rank}: {status}\n--- stdout\n{r.stdout}\n--- stderr (last 6000 chars)\n"
                     f"{r.stderr[-6000:]}")
    return "\n".join(parts)


def run_ok(argv: list[str], nprocs: int, timeout: float, env: dict | None = None) -> list[RankResult]:
    """``launch``, failing the calling test with every rank's output unless all exited with 0."""
    results = launch(argv, nprocs, timeout, env)
    if any(r.returncode != 0 for r in results):
        raise AssertionError("a rank failed:\n" + report(results))
    return results
