"""The full OpInfo conformance sweep; writes docs/op_coverage.md.

    ./scripts/op_conformance.sh                    # every OpInfo entry, 2 workers
    ./scripts/op_conformance.sh --ops 'nn.functional.*' --no-report
    ./scripts/op_conformance.sh --update-expected  # also rewrite expected_failures.py

Each worker is a subprocess that runs one OpInfo entry at a time and streams
its results back; a check that runs past ``--check-timeout`` is recorded as a
timeout, and a worker that hangs or crashes on an entry is replaced and the
entry recorded as failed.  The CPU fallback is off (it never counts as
coverage); with ``--fallback-telemetry`` (the default) each sample that fails
for lack of a lowering is retried with ``TORCHTPU_CPU_FALLBACK=1`` and
counted separately if it then passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MARK = "@@result "


def _worker(args) -> None:
    """Read entry names on stdin; print one result line per check, then a done line."""
    os.environ.pop("TORCHTPU_CPU_FALLBACK", None)
    from conformance import harness
    from torchtpu.dispatch import fallback

    ops = harness.ops_by_name()
    kinds = args.kinds.split(",")
    dtypes = set(args.dtypes.split(","))
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        op = ops[name]
        for kind, dtype in harness.checks_for(op, kinds):
            if dtype not in dtypes:
                continue
            try:
                with harness.time_limit(args.check_timeout):
                    result = harness.run_check(
                        op, kind, dtype, max_samples=args.max_samples, fallback_telemetry=args.fallback_telemetry
                    )
            except harness.CheckTimeout as e:
                result = harness.Result(name, kind, dtype, total=1, reason=f"timeout: {e}")
            print(MARK + json.dumps(dataclasses.asdict(result)), flush=True)
            print(f"{name} {kind} {dtype}: {result.passed}/{result.total} {result.seconds}s", file=sys.stderr, flush=True)
        decomposed = sorted(str(o) for o in fallback.DECOMPOSED)
        print(MARK + json.dumps({"done": name, "decomposed": decomposed}), flush=True)


class Worker:
    """A worker subprocess; a reader thread puts (worker, record) pairs on a shared queue."""

    def __init__(self, args, inbox):
        command = [sys.executable, "-m", "conformance.sweep", "--worker", *self._forwarded(args)]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), TORCHTPU_CPU_FALLBACK="0")
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=args.log, text=True, bufsize=1,
        )
        self.op = None
        self.started = time.monotonic()
        threading.Thread(target=self._read, args=(inbox,), daemon=True).start()

    def _read(self, inbox):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                inbox.put((self, json.loads(line[len(MARK):])))
        inbox.put((self, None))  # the worker exited

    @staticmethod
    def _forwarded(args):
        out = ["--kinds", args.kinds, "--dtypes", args.dtypes, "--check-timeout", str(args.check_timeout)]
        if args.max_samples:
            out += ["--max-samples", str(args.max_samples)]
        if not args.fallback_telemetry:
            out.append("--no-fallback-telemetry")
        return out

    def give(self, pending):
        """Hand over the next entry, or close the worker when there is none."""
        if not pending:
            self.op = None
            self.proc.stdin.close()
            return
        self.op, self.started = pending.pop(0), time.monotonic()
        self.proc.stdin.write(self.op + "\n")
        self.proc.stdin.flush()

    def overdue(self, limit) -> bool:
        return self.op is not None and time.monotonic() - self.started > limit


def run_sweep(names, args) -> dict:
    """Run every named entry on ``args.workers`` workers: result records and decomposed ops."""
    pending, results, decomposed = list(names), [], set()
    inbox = queue.Queue()
    live = {Worker(args, inbox) for _ in range(min(args.workers, len(pending)))}
    done, total = 0, len(pending)
    while live:
        try:
            worker, record = inbox.get(timeout=5)
        except queue.Empty:
            worker, record = None, None
        if worker is not None and worker in live:
            if record is None:  # exited: finished, crashed or killed
                live.discard(worker)
                if worker.op is not None:
                    results.append(_failed(worker.op, "worker crashed"))
                    done += 1
                if pending:
                    live.add(Worker(args, inbox))
            elif "op" in record:
                results.append(record)
            else:
                if "done" in record:
                    done += 1
                    decomposed.update(record["decomposed"])
                    print(f"[{done}/{total}] {record['done']} ({time.monotonic() - worker.started:.0f}s)", flush=True)
                worker.give(pending)
        for worker in [w for w in live if w.overdue(args.op_timeout)]:
            live.discard(worker)
            worker.proc.kill()
            results.append(_failed(worker.op, f"timeout: entry ran past {args.op_timeout}s"))
            done += 1
            if pending:
                live.add(Worker(args, inbox))
    return {"results": results, "decomposed": sorted(decomposed)}


def _failed(name, reason):
    """An entry whose worker died: every check it did not report counts as failed."""
    return {"op": name, "kind": "*", "dtype": "*", "total": 0, "passed": 0,
            "fallback_only": 0, "reason": reason, "random": False}


def _merged(old, new) -> dict:
    """``old`` sweep results with the entries ``new`` swept replaced."""
    swept = {r["op"] for r in new["results"]}
    results = [r for r in old["results"] if r["op"] not in swept] + new["results"]
    return {"results": results, "decomposed": sorted(set(old["decomposed"]) | set(new["decomposed"])),
            "settings": old.get("settings", {}), "seconds": old.get("seconds")}


def _settings(args) -> dict:
    return {k: getattr(args, k) for k in ("ops", "kinds", "dtypes", "max_samples", "check_timeout", "workers")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="*", help="glob over OpInfo names (name.variant), comma-separated")
    p.add_argument("--kinds", default="forward,grad,inplace,out,errors")
    p.add_argument("--dtypes", default="float32,bfloat16,float16,float64,complex64,int64,int32,bool")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--check-timeout", type=float, default=90, help="seconds per (entry, kind, dtype)")
    p.add_argument("--op-timeout", type=float, default=600, help="seconds per entry before its worker is replaced")
    p.add_argument("--max-samples", type=int, default=0, help="cap on samples per check (0: all)")
    p.add_argument("--no-fallback-telemetry", dest="fallback_telemetry", action="store_false")
    p.add_argument("--results", default=str(ROOT / "build" / "op_conformance.json"))
    p.add_argument("--merge", action="store_true", help="replace only the swept entries in --results")
    p.add_argument("--from-results", action="store_true", help="skip running; report from --results")
    p.add_argument("--no-report", dest="report", action="store_false")
    p.add_argument("--update-expected", action="store_true", help="rewrite expected_failures.py from this run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    sys.path.insert(0, str(ROOT / "tests"))
    from conformance import report

    results_path = pathlib.Path(args.results)
    if args.from_results:
        sweep = json.loads(results_path.read_text())
    else:
        from conformance import harness

        patterns = args.ops.split(",")
        names = [n for n in harness.ops_by_name() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        started = time.monotonic()
        results_path.parent.mkdir(parents=True, exist_ok=True)
        with open(results_path.with_suffix(".log"), "w") as args.log:
            sweep = run_sweep(names, args)
        if args.merge:
            sweep = _merged(json.loads(results_path.read_text()), sweep)
        else:
            sweep.update(seconds=round(time.monotonic() - started), settings=_settings(args))
        print(f"swept {len(names)} OpInfo entries in {time.monotonic() - started:.0f}s")
        results_path.write_text(json.dumps(sweep, indent=0))
    summary = report.summarize(sweep)
    if args.update_expected:
        report.write_expected_failures(summary)
        summary = report.summarize(sweep)
    if args.report:
        report.write_markdown(sweep, summary, ROOT / "docs" / "op_coverage.md")
    print(report.console_summary(summary))
    return 1 if summary["unexpected_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
