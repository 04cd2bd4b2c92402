"""``torchtpu tune analyze``: run a program for a few steps under instrumentation and rank what costs time.

Every event that costs time is caught where it happens and traced back to the
user's file and line: Dynamo's recompiles and graph breaks (its own logs),
torchtpu's recompiles, host syncs, CPU fallbacks and ops run one by one
outside a compiled graph (``metrics.listener``), and the matrix products of
every compiled graph and eager op, checked against the target chip's matrix
unit.  What is counted and timed here is *measured*; what an event costs on
the target chip is *estimated* from the chip table and the per-op costs
measured on this machine at the start (each finding says which).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import statistics
import sys
import sysconfig
import time

from .chips import MXU_PASSES

KINDS = ("recompile", "graph_break", "host_sync", "cpu_fallback", "eager_op", "misaligned_dim", "float32_matmul",
         "padding_waste", "memory")
DEFAULT_CHIP = "v6e"
PADDING_WASTE_LIMIT = 0.25  # a bucketed dimension with more padding than this is a finding
MEMORY_WARNING_SHARE = 0.85  # peak memory above this share of the chip's HBM is a finding


@dataclasses.dataclass
class Finding:
    """One thing that slows the program down, where in the user's code, and what to change."""

    kind: str  # one of KINDS
    file: str
    line: int
    message: str  # what happened and what to change
    estimated_cost_s: float  # per step
    count: float = 1  # per step (per run for recompiles and graph breaks)
    measured: bool = False  # whether the cost was measured here (else estimated)
    fix: dict = dataclasses.field(default_factory=dict)  # settings that would fix it, for `tune search`

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# ---- where in the user's code ------------------------------------------------------------------


def _library_dirs() -> tuple:
    import torch

    import torchtpu

    paths = sysconfig.get_paths()
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(torchtpu.__file__), paths["stdlib"],
            paths["purelib"], paths["platlib"]}
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


_LIBRARIES: tuple = ()


def is_user_file(filename: str) -> bool:
    global _LIBRARIES
    if not _LIBRARIES:
        _LIBRARIES = _library_dirs()
    if filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_LIBRARIES)


def user_location(frame=None) -> tuple[str, int]:
    """The innermost frame of the user's code on the current stack."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


_TRACE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def stack_trace_location(stack_trace: str | None) -> tuple[tuple[str, int] | None, str]:
    """The innermost user frame of an FX node's ``stack_trace`` (None when all of it is library
    code, a Hugging Face model say), and its innermost frame as ``file.py:line``."""
    frames = list(_TRACE_LINE.finditer(stack_trace or ""))
    innermost = f"{os.path.basename(frames[-1]['file'])}:{frames[-1]['line']}" if frames else ""
    for match in reversed(frames):
        if is_user_file(match["file"]):
            return (match["file"], int(match["line"])), innermost
    return None, innermost


# ---- matrix products -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Product:
    """A matrix product as the MXU sees it: ``batch`` products of [m, k] x [k, n]."""

    op: str
    batch: int
    m: int
    k: int
    n: int
    dtype: str
    source: str = ""  # the innermost frame that made it, in a compiled graph (``modeling_llama.py:83``)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def padded_flops(self, tile: int) -> int:
        return 2 * self.batch * self.m * _round_up(self.k, tile) * _round_up(self.n, tile)

    def describe(self) -> str:
        batch = f"{self.batch} x " if self.batch > 1 else ""
        source = f" at {self.source}" if self.source else ""
        return f"{self.op} {batch}[{self.m}x{self.k}] @ [{self.k}x{self.n}] ({self.dtype}){source}"


def _round_up(n: int, tile: int) -> int:
    return -(-n // tile) * tile


def _prod(values) -> int:
    return math.prod(int(v) for v in values)


def product_of(op_name: str, shapes: list, dtype: str, out_shape=None) -> Product | None:
    """The product an aten op computes, from its tensor arguments' shapes; None for other ops."""
    name = op_name.removeprefix("aten::").removeprefix("aten.").split(".")[0]
    if name in ("addmm", "baddbmm"):
        shapes = shapes[1:]  # the bias
    if name in ("mm", "addmm") and len(shapes) >= 2 and len(shapes[0]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return Product(name, 1, m, k, n, dtype)
    if name in ("bmm", "baddbmm") and len(shapes) >= 2 and len(shapes[0]) == 3:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return Product(name, b, m, k, n, dtype)
    if name == "linear" and len(shapes) >= 2:
        x, w = shapes[0], shapes[1]
        return Product(name, 1, _prod(x[:-1]), x[-1], w[0], dtype)
    if name == "convolution" and len(shapes) >= 2 and out_shape is not None:
        w = shapes[1]  # [out channels, in channels / groups, *kernel]
        return Product(name, 1, out_shape[0] * _prod(out_shape[2:]), _prod(w[1:]), w[0], dtype)
    return None


def _eager_product(op, args) -> Product | None:
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(tensors) < 2:
        return None
    out_shape = None
    if str(op).startswith("aten.convolution") and len(args) >= 9:
        out_shape = _conv_out_shape(tensors[0].shape, tensors[1].shape, *args[3:6])
    return product_of(str(op), [list(t.shape) for t in tensors], _dtype_name(tensors[0].dtype), out_shape)


def _conv_out_shape(x, w, stride, padding, dilation) -> list:
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x[2:], w[2:], stride, padding, dilation)]
    return [x[0], w[0], *spatial]


def _graph_products(gm):
    """(product, user location or None) for each matrix product node of an FX graph."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        vals = [a.meta.get("val") for a in node.args if hasattr(a, "meta")]
        shapes = [list(v.shape) for v in vals if hasattr(v, "shape")]
        out = node.meta.get("val")
        if not shapes or not all(isinstance(d, int) for s in shapes for d in s):
            continue  # symbolic sizes: no fixed shape to check
        product = product_of(str(node.target), shapes, _dtype_name(vals[0].dtype),
                             list(out.shape) if hasattr(out, "shape") else None)
        if product is not None:
            location, source = stack_trace_location(node.meta.get("stack_trace"))
            yield dataclasses.replace(product, source=source), location


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- per-op costs on this machine ------------------------------------------------------------


@dataclasses.dataclass
class HostCosts:
    """Measured on this machine before the analysis: what one eager op and one host sync cost."""

    eager_op_s: float
    host_sync_s: float


def measure_host_costs() -> HostCosts:
    import torch

    x = torch.ones(64, 64, device="tpu")
    for _ in range(20):
        y = x + x
    torch.tpu.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        y = x + x
    torch.tpu.synchronize()
    op = (time.perf_counter() - start) / 200
    start = time.perf_counter()
    for _ in range(30):
        (y + 1).sum().item()
    sync = max((time.perf_counter() - start) / 30 - 2 * op, op)
    return HostCosts(eager_op_s=op, host_sync_s=sync)


# ---- the analyzer ----------------------------------------------------------------------------


class _StopProgram(BaseException):
    """Raised at the optimizer step after the last analyzed one (BaseException: user code's
    ``except Exception`` must not swallow it)."""


# The detail of a recompile found in Dynamo's log: Dynamo traced the frame again (torchtpu's own only compile).
DYNAMO_RETRACE = "dynamo retrace"


@dataclasses.dataclass
class _Event:
    kind: str
    location: tuple
    key: str
    step: int
    detail: object = None


class Analyzer:
    """Collects the events of a run, by step, with the user's location of each."""

    def __init__(self, chip, max_steps=None, optimizer_steps=True):
        self.chip = chip
        self.max_steps = max_steps
        self.optimizer_steps = optimizer_steps  # whether an optimizer step ends a step (scripts)
        self.events: list[_Event] = []
        self.products = collections.Counter()  # (product, location, step or None) -> count
        self.graphs = 0
        self.compile_seconds: list[float] = []  # XLA compiles
        self.trace_seconds: list[float] = []  # Dynamo's traces of a frame (set when the run ends)
        self.step = 0
        self.step_starts = [time.perf_counter()]
        self.muted = False
        self.last_location = ("<unknown>", 0)

    def location(self) -> tuple:
        """Where the user's code is now; on autograd's threads (backward), where it last was."""
        file, line = user_location(sys._getframe(1))
        if file == "<unknown>":
            return self.last_location
        self.last_location = (file, line)
        return file, line

    # events from torchtpu (metrics.listener)
    def __call__(self, event: str, detail) -> None:
        if self.muted:
            return
        if event == "eager_op":
            self._eager_op(*detail)
        elif event == "graph":
            self.graphs += 1
            call_site = self.location()  # building the graph: the call of the compiled function
            for product, location in _graph_products(detail[1]):
                self.products[(product, location or call_site, None)] += 1
        elif event == "padding":
            self._add("padding_waste", self.location(), "pad_to_bucket", detail)
        elif event == "graph_break" and detail != "optimizer step":  # fused mode cut the graph
            self._add("graph_break", self.location(), f"fused graph ended: {detail}")
        elif event in ("host_sync", "cpu_fallback"):
            self._add(event, self.location(), str(detail))

    def _eager_op(self, op, args, kwargs) -> None:
        from ...runtime import context

        location = self.location()
        product = _eager_product(op, args)
        if product is not None:
            self.products[(product, location, self.step)] += 1
        if not context.current().launcher.defers:  # fused mode records the op into a graph
            self._add("eager_op", location, str(op))

    def _add(self, kind, location, key, detail=None) -> None:
        self.events.append(_Event(kind, location, key, self.step, detail))

    # events from logs (Dynamo's and ours)
    def log_record(self, record: logging.LogRecord) -> None:
        if self.muted:
            return
        text = record.getMessage()
        if record.name.endswith("__graph_breaks"):
            match = _GRAPH_BREAK.search(text)
            if match and "user stack suppressed" not in text:
                self._add("graph_break", (match["file"], int(match["line"])), _graph_break_reason(text))
        elif record.name.endswith("__recompiles"):
            match = _DYNAMO_RECOMPILE.search(text)
            if match:
                self._add("recompile", (match["file"], int(match["line"])),
                          f"{match['function']} recompiled: {match['reason'].strip()}", DYNAMO_RETRACE)
        elif record.name == "torchtpu.recompiles" and not getattr(record, "retraced", False):
            self._add("recompile", self.location(), _shortened(text.removeprefix("torchtpu: ")))

    def compiled(self, name, lowered, program, seconds) -> None:
        self.compile_seconds.append(seconds)

    def optimizer_stepped(self, *_) -> None:
        if self.optimizer_steps:
            self.step_done()

    def step_done(self) -> None:
        self.step += 1
        self.step_starts.append(time.perf_counter())
        if self.max_steps is not None and self.step >= self.max_steps:
            raise _StopProgram


_GRAPH_BREAK = re.compile(r"Graph break.*? in user code at (?P<file>.+?):(?P<line>\d+)")
_DYNAMO_RECOMPILE = re.compile(
    r"Recompiling function (?P<function>\S+) in (?P<file>.+?):(?P<line>\d+)\s+triggered by the following "
    r"guard failure\(s\):\s+- (?P<reason>[^\n]+)")


def _shortened(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _graph_break_reason(text: str) -> str:
    for line in text.splitlines():
        if line.strip().startswith("Explanation:"):
            return line.strip().removeprefix("Explanation:").strip()
    match = re.search(r"Graph Break Reason: (.*)", text)
    return match[1] if match else "unknown"


class _Capture(logging.Handler):
    def __init__(self, analyzer):
        super().__init__(logging.DEBUG)
        self.analyzer = analyzer

    def emit(self, record):
        self.analyzer.log_record(record)


def _dynamo_traces() -> list:
    """The durations of Dynamo's frame compiles so far (its own metrics: empty where a torch lacks them)."""
    from torch._dynamo import utils

    return list(getattr(utils, "compilation_time_metrics", {}).get("_compile.compile_inner", []))


@contextlib.contextmanager
def instrumented(analyzer: Analyzer):
    """Route every event of the program to ``analyzer`` while the block runs."""
    import torch._dynamo  # noqa: F401  (registers the artifact loggers read below)
    import torch._logging
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ... import config
    from ...runtime import compile_cache, metrics

    torch._logging.set_logs(graph_breaks=True, recompiles=True)
    handler = _Capture(analyzer)
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.endswith(("__graph_breaks", "__recompiles"))] + [logging.getLogger("torchtpu.recompiles")]
    propagate = [lg.propagate for lg in loggers]
    for lg in loggers:  # to us only: the report says it, without the log's pages
        lg.addHandler(handler)
        lg.propagate = False
    stop_observing = compile_cache.observe(analyzer.compiled)
    step_hook = register_optimizer_step_post_hook(analyzer.optimizer_stepped)
    previous, metrics.listener = metrics.listener, analyzer
    traces_before = len(_dynamo_traces())
    try:
        with config.override(log_recompiles=True):
            yield analyzer
    finally:
        analyzer.trace_seconds = _dynamo_traces()[traces_before:]
        metrics.listener = previous
        step_hook.remove()
        stop_observing()
        for lg, before in zip(loggers, propagate):
            lg.removeHandler(handler)
            lg.propagate = before
        torch._logging.set_logs()


# ---- from events to findings -----------------------------------------------------------------


@dataclasses.dataclass
class Report:
    """What a run measured and the findings, ranked by estimated cost per step."""

    findings: list
    chip: str
    steps: int
    step_seconds: list  # measured, per step
    peak_memory_bytes: int
    hbm_bytes: float
    host_costs: HostCosts
    compiled_graphs: int
    compile_seconds: float

    @property
    def median_step_s(self) -> float:
        steady = self.step_seconds[1:] or self.step_seconds
        return statistics.median(steady) if steady else 0.0

    def to_json(self) -> list:
        return [f.to_json() for f in self.findings]

    def to_text(self) -> str:
        lines = [
            f"torchtpu tune analyze: {self.steps} step(s), median step {self.median_step_s * 1e3:.1f} ms (measured), "
            f"target chip {self.chip}",
            f"  {self.compiled_graphs} compiled graph(s), {self.compile_seconds:.1f} s compiling (measured); "
            f"peak memory {self.peak_memory_bytes / 2**20:.1f} MiB of {self.hbm_bytes / 2**30:.0f} GiB HBM on {self.chip}",
            f"  costs measured here: eager op {self.host_costs.eager_op_s * 1e6:.1f} us, "
            f"host sync {self.host_costs.host_sync_s * 1e6:.1f} us",
        ]
        if not self.findings:
            return "\n".join(lines + ["no findings"])
        lines.append("  findings, costliest first (est. cost/step is estimated unless marked (m), measured):")
        lines.append(f"{'#':>3}  {'kind':<15} {'est. cost/step':>14}  {'per step':>8}  where / what")
        for i, f in enumerate(self.findings, 1):
            cost = _seconds_text(f.estimated_cost_s) + (" (m)" if f.measured else "")
            lines.append(f"{i:>3}  {f.kind:<15} {cost:>14}  {_count_text(f.count):>8}  {f.file}:{f.line}")
            lines.append(f"{'':>5}{f.message}")
        return "\n".join(lines)


def _seconds_text(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-5 else f"{seconds * 1e6:.3f} us"


def _count_text(count: float) -> str:
    return f"{count:g}" if count == int(count) else f"{count:.2f}"


def findings_of(analyzer: Analyzer, chip, host_costs: HostCosts, step_seconds: list, peak_memory: int) -> list:
    # Per-step counts come from the steps after the first (the warm-up), when there are any;
    # events after the last step boundary (a script's tail) belong to no whole step.
    steady = range(1 if analyzer.step > 1 else 0, max(1, analyzer.step))
    step_s = statistics.median(step_seconds) if step_seconds else 0.0
    findings = []
    findings += _event_findings(analyzer, host_costs, steady)
    findings += _recompile_findings(analyzer, max(1, analyzer.step), step_seconds)
    findings += _product_findings(analyzer, chip, steady)
    findings += _padding_findings(analyzer, step_s)
    findings += _memory_findings(chip, peak_memory, step_s)
    return sorted(findings, key=lambda f: (-f.estimated_cost_s, f.kind, f.file, f.line))


_EVENT_ADVICE = {
    "host_sync": ("the host waits for the device ({key}): the device idles while Python runs. Keep values "
                  "on the device (log every N steps, torch.where instead of `if tensor:`)", {}),
    "cpu_fallback": ("{key} has no tpu lowering and ran on the CPU (its inputs copied both ways): file an "
                     "issue, or rewrite it with ops torchtpu lowers", {}),
    "eager_op": ("ops ran one by one outside a compiled graph ({key}): put this code inside "
                 "torch.compile(backend='tpu'), or use fused eager mode (TORCHTPU_DEFER_AND_FUSE=1)",
                 {"defer_and_fuse": True}),
    "graph_break": ("{key}: the graph ends here and the code after it runs as a new graph; "
                    "move the break out of the step or rewrite it so the step compiles as one graph", {}),
}


def _event_findings(analyzer, host_costs, steady) -> list:
    per_event = {"host_sync": host_costs.host_sync_s, "cpu_fallback": host_costs.host_sync_s,
                 "eager_op": host_costs.eager_op_s, "graph_break": host_costs.eager_op_s}
    groups = collections.defaultdict(collections.Counter)  # (kind, location) -> key -> count
    for event in analyzer.events:
        if event.kind in per_event and (event.kind == "graph_break" or event.step in steady):
            groups[(event.kind, event.location)][event.key] += 1
    findings = []
    for (kind, (file, line)), keys in groups.items():
        total = sum(keys.values())
        # A Dynamo graph break is logged once, when the frame is traced, and costs every step.
        per_step = 1 if kind == "graph_break" and not keys.most_common(1)[0][0].startswith("fused") \
            else total / len(steady)
        key = ", ".join(k for k, _ in keys.most_common(3)) + (", ..." if len(keys) > 3 else "")
        advice, fix = _EVENT_ADVICE[kind]
        findings.append(Finding(kind, file, line, advice.format(key=key), per_step * per_event[kind],
                                count=per_step, fix=dict(fix)))
    return findings


def _recompile_findings(analyzer, steps, step_seconds) -> list:
    """Recompiles by place. A recompile's cost is measured where it can be: the time its step took
    beyond the median of the steps that compiled nothing (shared among that step's recompiles);
    else estimated from the run's means: an XLA compile, plus Dynamo's trace of the frame for one
    of Dynamo's recompiles (torchtpu's own, a known graph meeting new shapes, only compile)."""
    recompiles = [e for e in analyzer.events if e.kind == "recompile"]
    per_step = collections.Counter(e.step for e in recompiles)
    clean = [t for k, t in enumerate(step_seconds) if k > 0 and k not in per_step]
    compile_s = statistics.mean(analyzer.compile_seconds) if analyzer.compile_seconds else 0.0
    trace_s = statistics.mean(analyzer.trace_seconds) if analyzer.trace_seconds else 0.0
    groups = collections.defaultdict(list)
    for event in recompiles:
        groups[event.location].append(event)
    findings = []
    for (file, line), events in groups.items():
        measurable = clean and all(0 < e.step < len(step_seconds) for e in events)
        if measurable:
            baseline = statistics.median(clean)
            total = sum(max(step_seconds[e.step] - baseline, 0.0) / per_step[e.step] for e in events)
        else:
            total = sum(compile_s + (trace_s if e.detail is DYNAMO_RETRACE else 0.0) for e in events)
        message = (f"recompiled {len(events)} time(s): {events[-1].key}. Keep input shapes and dtypes fixed "
                   "(pad to a bucket with torch.tpu.pad_to_bucket), or mark the changing size dynamic "
                   "(torch._dynamo.mark_dynamic)")
        findings.append(Finding("recompile", file, line, message, total / steps, count=len(events),
                                measured=bool(measurable)))
    return findings


def _product_findings(analyzer, chip, steady) -> list:
    from ...runtime import precision

    passes = MXU_PASSES[precision.current()]
    per_step_of = collections.Counter()
    for (product, location, step), count in analyzer.products.items():
        if step is None:  # in a compiled graph: run once per step (estimated)
            per_step_of[(product, location)] = max(per_step_of[(product, location)], 1)
        elif step in steady:
            per_step_of[(product, location)] += count / len(steady)
    findings = []
    for (product, (file, line)), per_step in per_step_of.items():
        findings += _misaligned(product, file, line, per_step, chip)
        if product.dtype == "float32" and passes > 1:
            seconds = per_step * product.flops / chip.bf16_flops * (passes - 1)
            message = (f"{product.describe()} runs in float32 at matmul precision {precision.current()!r}, "
                       f"{passes} bfloat16 passes on the MXU: run it under torch.autocast('tpu', "
                       "dtype=torch.bfloat16), or at one pass where float32 accuracy is not needed "
                       "(TORCHTPU_MATMUL_PRECISION=default, torch.set_float32_matmul_precision('medium'))")
            findings.append(Finding("float32_matmul", file, line, message, seconds, count=per_step,
                                    fix={"matmul_precision": "default"}))
    return _merge(findings)


def _misaligned(product, file, line, per_step, chip) -> list:
    tile = chip.mxu_tile
    bad = [(name, size) for name, size in (("k", product.k), ("n", product.n)) if size % tile]
    if not bad:
        return []
    waste = product.padded_flops(tile) / product.flops - 1
    seconds = per_step * (product.padded_flops(tile) - product.flops) / chip.bf16_flops
    dims = ", ".join(f"{name}={size} -> {_round_up(size, tile)}" for name, size in bad)
    message = (f"{product.describe()}: {dims} to fill {chip.name}'s {tile}x{tile} matrix unit; the unit "
               f"computes {waste:.0%} more than needed. Pad the dimension (hidden sizes, vocabulary, heads x "
               f"head dim) to a multiple of {tile}")
    return [Finding("misaligned_dim", file, line, message, seconds, count=per_step)]


def _merge(findings) -> list:
    """One finding per kind and line (a layer's product and its two transposes in backward):
    the costs added, the costliest product's message shown."""
    groups = collections.defaultdict(list)
    for f in findings:
        groups[(f.kind, f.file, f.line)].append(f)
    merged = []
    for group in groups.values():
        first = max(group, key=lambda f: f.estimated_cost_s)
        more = f" ({len(group)} products here; the costliest shown)" if len(group) > 1 else ""
        merged.append(dataclasses.replace(first, message=first.message + more,
                                          count=sum(f.count for f in group),
                                          estimated_cost_s=sum(f.estimated_cost_s for f in group)))
    return merged


def _padding_findings(analyzer, step_s) -> list:
    sizes = collections.defaultdict(lambda: [0, 0, 0])  # location -> real, padded, calls
    for event in analyzer.events:
        if event.kind == "padding_waste":
            real, padded = event.detail
            entry = sizes[event.location]
            entry[0] += real
            entry[1] += padded
            entry[2] += 1
    findings = []
    for (file, line), (real, padded, calls) in sizes.items():
        share = 1 - real / padded if padded else 0.0
        if share > PADDING_WASTE_LIMIT:
            message = (f"{share:.0%} of the bucketed dimension is padding over {calls} call(s): the work on "
                       "padding is wasted; use finer buckets (pad_to_bucket(..., buckets=[...]) with sizes "
                       "closer to the real ones)")
            findings.append(Finding("padding_waste", file, line, message, share * step_s, count=calls))
    return findings


def _memory_findings(chip, peak, step_s) -> list:
    share = peak / chip.hbm_bytes
    if share <= MEMORY_WARNING_SHARE:
        return []
    fits = share <= 1
    message = (f"peak device memory {peak / 2**30:.1f} GiB is {share:.0%} of {chip.name}'s "
               f"{chip.hbm_bytes / 2**30:.0f} GiB HBM" + ("" if fits else ": the step does not fit one chip")
               + "; shard it (FSDP, `torchtpu tune plan`), use activation checkpointing, or a smaller batch")
    return [Finding("memory", "<program>", 0, message, 0.0 if fits else step_s, measured=True)]


# ---- entry points ----------------------------------------------------------------------------


def analyze(step_fn, *inputs, steps: int = 3, chip: str = DEFAULT_CHIP) -> Report:
    """Run ``step_fn(*inputs)`` ``steps`` times under instrumentation and report what costs time.

    The first step is the warm-up (compiles); per-step counts come from the others."""
    import torch

    from .chips import chip as chip_named

    if steps < 1:
        raise ValueError(f"analyze: steps must be at least 1, got {steps}")
    target = chip_named(chip)
    host_costs = measure_host_costs()
    analyzer = Analyzer(target, optimizer_steps=False)
    torch.tpu.reset_peak_memory_stats()
    step_seconds = []
    with instrumented(analyzer):
        for _ in range(steps):
            start = time.perf_counter()
            step_fn(*inputs)
            _synchronize_quietly(analyzer)
            step_seconds.append(time.perf_counter() - start)
            analyzer.step_done()
    return _report(analyzer, target, host_costs, step_seconds)


def analyze_script(path: str, argv=(), steps: int | None = None, chip: str = DEFAULT_CHIP) -> Report:
    """Run a script as ``__main__`` under instrumentation; its optimizer steps are the steps
    (the whole run is one step if it has none), and ``steps`` stops it after that many."""
    import runpy

    import torch

    from .chips import chip as chip_named

    target = chip_named(chip)
    host_costs = measure_host_costs()
    analyzer = Analyzer(target, max_steps=steps)
    torch.tpu.reset_peak_memory_stats()
    saved_argv = sys.argv
    sys.argv = [path, *argv]
    try:
        with instrumented(analyzer):
            runpy.run_path(path, run_name="__main__")
    except _StopProgram:
        pass
    finally:
        sys.argv = saved_argv
    _synchronize_quietly(analyzer)
    if analyzer.step == 0:  # no optimizer: the run is the step
        analyzer.step_done()
    starts = analyzer.step_starts
    return _report(analyzer, target, host_costs, [b - a for a, b in zip(starts, starts[1:])])


def _synchronize_quietly(analyzer) -> None:
    import torch

    analyzer.muted = True
    try:
        torch.tpu.synchronize()
    finally:
        analyzer.muted = False


def _report(analyzer, target, host_costs, step_seconds) -> Report:
    import torch

    peak = torch.tpu.max_memory_allocated()
    return Report(
        findings=findings_of(analyzer, target, host_costs, step_seconds, peak), chip=target.name,
        steps=analyzer.step, step_seconds=step_seconds, peak_memory_bytes=peak, hbm_bytes=target.hbm_bytes,
        host_costs=host_costs, compiled_graphs=analyzer.graphs, compile_seconds=sum(analyzer.compile_seconds))


# ---- the command -------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    import argparse

    parser.usage = "%(prog)s [options] script.py [script arguments]"
    parser.add_argument("--steps", type=int, default=None,
                        help="stop after this many optimizer steps (default: run to the end)")
    parser.add_argument("--chip", default=DEFAULT_CHIP, help="the TPU generation to estimate for (v4 ... v7x)")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    parser.add_argument("script", help="the Python program to run as __main__ (options of analyze go before it)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its own arguments")


def run(args) -> int:
    if not os.path.exists(args.script):
        raise SystemExit(f"torchtpu tune analyze: no such file: {args.script}")
    # With --json the script's own output goes to stderr, so stdout is the JSON alone.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        report = analyze_script(args.script, args.script_args, steps=args.steps, chip=args.chip)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.to_text())
    return 0
