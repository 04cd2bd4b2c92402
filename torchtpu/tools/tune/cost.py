"""``torchtpu tune cost``: predict a compiled step's time and MFU on a TPU generation.

The model is a roofline per operation of the optimized XLA program: each
top-level op (a fusion, a dot, a copy, ...) takes the longer of its work
(matrix products at the rate for their dtype and shape, vector work,
gathers, reductions, transcendentals) and its memory traffic, plus a fixed
cost per op and per program.  The figures come from the compiled program
itself (``compiled.as_text()``, checked against ``compiled.cost_analysis()``).
A TPU target takes its peaks from ``chips.py``; the "host" target is this
machine, measured once (``calibrate``) and kept in
``~/.cache/torchtpu/calibration.json``, so that the model can be checked
against measured XLA:CPU steps (``bench/tune_cost.py``, docs/tune-cost.md).

    from torchtpu.tools.tune import cost   # or torchtpu.tune.cost
    result = cost.predict(step_fn, *inputs, chip="v5e")   # runs step_fn a few times under the observer
    print(result.summary())
"""

from __future__ import annotations

import dataclasses
import math
import re

from .chips import MXU_PASSES

HOST = "host"
_HIDE_FROM_ROOFLINE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                       "partition-id", "replica-id", "opt-barrier", "domain", "add-dependency"}
_CONTROL_FLOW = {"while", "call", "conditional"}
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "sine", "cosine",
                   "tan", "rsqrt", "sqrt", "cbrt", "power", "logistic", "erf", "atan2"}
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")


# ---- the optimized program, op by op --------------------------------------------------------------------


@dataclasses.dataclass
class Op:
    """One top-level operation of a compiled program, as the roofline sees it."""

    name: str
    opcode: str  # "fusion", "copy", "dot", ...
    matmul_flops: float = 0.0  # dots and convolutions
    matmul_elements: float = 0.0  # of their operands and results: flops / elements is their intensity
    conv_narrowness: float = 0.0  # a convolution's smaller side as a product: min(rows, depth)
    elementwise: float = 0.0  # elements produced by its other instructions (the vector units' work)
    gathered: float = 0.0  # elements gathered or scattered: an address each
    reductions: list = dataclasses.field(default_factory=list)  # (elements reduced, elements per result) each
    transcendentals: float = 0.0
    bytes: float = 0.0  # operands read plus results written
    cold_bytes: float = 0.0  # the part read straight from the program's arguments: not in any cache yet
    transposes: bool = False  # it changes a layout: strided accesses, slower than streaming
    matmul_dtype: str = "f32"  # the operand dtype of its matrix products
    precision: str = "default"  # an f32 product's operand_precision
    repeats: float = 1.0  # a while loop's trip count


@dataclasses.dataclass
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: list
    attributes: str


def _split_operands(text: str) -> tuple[str, str]:
    """The text inside an instruction's first parentheses, and what follows them."""
    depth = 1
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[:i], text[i + 1:]
    return text, ""


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")


def parse_hlo(text: str) -> tuple[dict, str]:
    """Computations of an HLO module's text: ``{name: [instructions]}`` and the entry's name."""
    computations, entry, current = {}, None, None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(2), [])
            entry = header.group(2) if header.group(1) else entry
            continue
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            name, shape, opcode, rest = match.groups()
            operands, attributes = _split_operands(rest)
            current.append(_Instruction(name, shape, opcode, re.findall(r"%([\w.\-]+)", operands), attributes))
    return computations, entry


def _arrays(shape: str) -> list[tuple[str, list[int]]]:
    return [(dtype, [int(d) for d in dims.split(",") if d]) for dtype, dims in _ARRAY.findall(shape)
            if dtype in _DTYPE_BYTES]


def _elements(shape: str) -> int:
    return sum(math.prod(dims) for _, dims in _arrays(shape))


def shape_bytes(shape: str) -> float:
    return sum(math.prod(dims) * _DTYPE_BYTES[dtype] for dtype, dims in _arrays(shape))


def _attribute(attributes: str, key: str) -> str | None:
    found = re.search(rf"\b{key}=\{{?([^}},]*(?:,[^}}=]*)*)\}}?", attributes)
    return found.group(1) if found else None


_DATA_MOVEMENT = {"bitcast", "reshape", "broadcast", "parameter", "constant", "tuple", "get-tuple-element"}


def _dot_flops(inst: _Instruction, shapes: dict) -> float:
    lhs = _arrays(shapes.get(inst.operands[0], ""))
    contracting = _attribute(inst.attributes, "lhs_contracting_dims") or ""
    depth = math.prod(lhs[0][1][int(d)] for d in contracting.split(",") if d) if lhs else 1
    return 2.0 * _elements(inst.shape) * depth


def _convolution_as_product(inst: _Instruction, shapes: dict) -> tuple[float, float, float]:
    """A convolution as the matrix product it amounts to: (rows, depth, columns), that is (batch x output
    positions, kernel positions x input features, output features)."""
    kernel = _arrays(shapes.get(inst.operands[1], ""))
    labels = re.search(r"dim_labels=\w+_(\w+)->", inst.attributes)
    if not kernel or not labels:
        return 0.0, 0.0, 0.0
    dims = kernel[0][1]
    columns = max(dims[labels.group(1).index("o")], 1)
    return _elements(inst.shape) / columns, math.prod(dims) / columns, columns


def _convolution_flops(inst: _Instruction, shapes: dict) -> float:
    rows, depth, columns = _convolution_as_product(inst, shapes)
    return 2.0 * rows * depth * columns


def _layout(shape: str) -> str:
    found = re.search(r"\]\{([\d,]+)", shape)
    return found.group(1) if found else ""


def _changes_layout(inst: _Instruction, shapes: dict) -> bool:
    if inst.opcode == "transpose":
        return True
    if inst.opcode != "copy" or not inst.operands:
        return False
    return _layout(shapes.get(inst.operands[0], "")) != _layout(inst.shape)


def _add_inner_costs(op: Op, computation: list, shapes: dict) -> None:
    """The work of the instructions inside a fusion (or of a bare instruction, as a one-line computation).
    A copy or transpose outside a fusion is only memory traffic: its bytes say all."""
    op.transposes = any(_changes_layout(inst, shapes) for inst in computation)
    if len(computation) == 1 and computation[0].opcode in ("copy", "transpose"):
        return
    for inst in computation:
        if inst.opcode in ("dot", "convolution"):
            flops = (_dot_flops if inst.opcode == "dot" else _convolution_flops)(inst, shapes)
            op.matmul_flops += flops
            op.matmul_elements += _elements(inst.shape) + sum(_elements(shapes.get(o, "")) for o in inst.operands[:2])
            if inst.opcode == "convolution":
                op.conv_narrowness = min(_convolution_as_product(inst, shapes)[:2])
            lhs = _arrays(shapes.get(inst.operands[0], ""))
            op.matmul_dtype = lhs[0][0] if lhs else op.matmul_dtype
            op.precision = (_attribute(inst.attributes, "operand_precision") or "default").split(",")[0]
        elif inst.opcode == "reduce":
            reduced = sum(_elements(shapes.get(o, "")) for o in inst.operands[: len(inst.operands) // 2])
            op.reductions.append((reduced, reduced / max(_elements(inst.shape), 1)))
        elif inst.opcode in ("gather", "scatter"):
            op.gathered += _elements(inst.shape if inst.opcode == "gather" else shapes.get(inst.operands[-1], ""))
        elif inst.opcode not in _DATA_MOVEMENT:  # gathers, selects and index arithmetic cost work too
            op.elementwise += _elements(inst.shape)
            op.transcendentals += _elements(inst.shape) if inst.opcode in _TRANSCENDENTAL else 0


def _trip_count(inst: _Instruction) -> float:
    found = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attributes)
    return float(found.group(1)) if found else 1.0


def _called(inst: _Instruction, key: str) -> list[str]:
    """The computations an instruction names under ``key``: ``calls=%f`` or ``branch_computations={%a, %b}``."""
    found = re.search(rf"\b{key}=(?:\{{([^}}]*)\}}|%?([\w.\-]+))", inst.attributes)
    if not found:
        return []
    return [name.strip().lstrip("%") for name in (found.group(1) or found.group(2)).split(",") if name.strip()]


def output_arrays(text: str) -> list[float]:
    """Bytes of each array the entry computation of an HLO module returns."""
    header = text.split("\n", 1)[0]
    layout = re.search(r"entry_computation_layout=\{.*?\)->(.*?)\}(?:, [a-z_]+=|\s*$)", header)
    return [math.prod(dims) * _DTYPE_BYTES[dtype] for dtype, dims in _arrays(layout.group(1))] if layout else []


def _arguments(entry: list) -> set:
    """The entry's parameters and the free views of them (bitcasts, tuple elements): data that comes
    from memory, not from an op that has just run."""
    names = set()
    for inst in entry:
        if inst.opcode == "parameter" or (inst.opcode in ("bitcast", "get-tuple-element", "reshape")
                                          and inst.operands and inst.operands[0] in names):
            names.add(inst.name)
    return names


def hlo_ops(text: str) -> list[Op]:
    """The top-level ops of an optimized HLO module (the entry, and the bodies of its loops and calls)."""
    computations, entry = parse_hlo(text)
    shapes = {inst.name: inst.shape for body in computations.values() for inst in body}
    arguments = _arguments(computations.get(entry, []))
    ops: list[Op] = []

    def walk(name: str, repeats: float) -> None:
        for inst in computations.get(name, []):
            if inst.opcode in _CONTROL_FLOW:
                times = repeats * _trip_count(inst) if inst.opcode == "while" else repeats
                for key in ("body", "to_apply", "branch_computations", "true_computation", "false_computation"):
                    for callee in _called(inst, key):
                        walk(callee, times)
                continue
            if inst.opcode in _HIDE_FROM_ROOFLINE:
                continue
            op = Op(inst.name, inst.opcode, repeats=repeats)
            op.bytes = shape_bytes(inst.shape) + sum(shape_bytes(shapes.get(o, "")) for o in inst.operands)
            op.cold_bytes = sum(shape_bytes(shapes.get(o, "")) for o in inst.operands if o in arguments)
            inner = [computations.get(c, []) for c in _called(inst, "calls")] if inst.opcode == "fusion" else [[inst]]
            for body in inner:
                _add_inner_costs(op, body, shapes)
            ops.append(op)

    walk(entry, 1.0)
    return ops


@dataclasses.dataclass
class Program:
    """A compiled program's costs: XLA's own totals, its memory, and its ops."""

    name: str
    flops: float  # XLA's cost analysis
    bytes_accessed: float  # XLA's cost analysis
    transcendentals: float
    memory: dict  # XLA's memory analysis (argument, output, temp, alias bytes)
    ops: list
    output_arrays: list = dataclasses.field(default_factory=list)  # bytes of each array the program returns
    arguments: int = 0  # arrays it takes

    def fresh_bytes(self, threshold: float) -> float:
        """Bytes of the buffers of ``threshold`` or more that a run allocates: its outputs (less those
        aliasing donated inputs) and its scratch space, which XLA allocates as one buffer."""
        outputs = max(0.0, sum(b for b in self.output_arrays if b >= threshold) - self.memory.get("alias", 0))
        temp = self.memory.get("temp", 0)
        return outputs + (temp if temp >= threshold else 0.0)

    @property
    def matmul_flops(self) -> float:
        return sum(op.matmul_flops * op.repeats for op in self.ops)


def _cost_analysis(compiled) -> dict:
    costs = compiled.cost_analysis()
    if isinstance(costs, (list, tuple)):  # older jax: one dict per device program
        costs = costs[0] if costs else {}
    return costs or {}


def _memory_analysis(compiled) -> dict:
    stats = compiled.memory_analysis()
    names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
    return {name.removesuffix("_size_in_bytes"): getattr(stats, name, 0) for name in names} if stats else {}


def program_costs(compiled, name: str = "program") -> Program:
    """The costs of a jax ``Compiled`` program (a ``Lowered`` one is compiled first)."""
    if not hasattr(compiled, "as_text") or hasattr(compiled, "compile"):
        compiled = compiled.compile()
    costs = _cost_analysis(compiled)
    text = compiled.as_text()
    return Program(name, float(costs.get("flops", 0.0)), float(costs.get("bytes accessed", 0.0)),
                   float(costs.get("transcendentals", 0.0)), _memory_analysis(compiled), hlo_ops(text),
                   output_arrays(text), _parameter_count(text))


# ---- targets: a TPU generation, or this machine calibrated ---------------------------------------------


@dataclasses.dataclass
class Target:
    """What the roofline needs of a machine.  Rates are curves ``[(size, rate), ...]`` so that the
    calibrated host can say that small products and small copies run slower than big ones; a TPU's
    curves are one point (its peak)."""

    name: str
    matmul: dict  # operand dtype -> [(flops of a square product, FLOP/s)]
    bandwidth: list  # [(bytes moved by the op, bytes/s)]
    transcendentals_per_s: float
    op_seconds: float  # fixed cost of each top-level op
    program_seconds: float  # fixed cost of launching a program
    peak_flops: float  # the denominator of MFU
    fresh_seconds_per_byte: float = 0.0  # first touch of newly mapped memory (the host's page faults)
    fresh_threshold: float = math.inf  # buffers at least this big are newly mapped on every run
    skinny_matmul: dict = dataclasses.field(default_factory=dict)  # dtype -> [(flops per element, FLOP/s)]
    elementwise_per_s: float = math.inf  # elements the vector units produce per second inside fusions
    gathered_per_s: float = math.inf
    reduce: list = dataclasses.field(default_factory=list)  # [(elements per result, elements reduced per s)]
    convolution: list = dataclasses.field(default_factory=list)  # [(min(rows, depth), FLOP/s)], f32
    transpose_bandwidth: list = dataclasses.field(default_factory=list)  # [(bytes moved, bytes/s)]
    graph_seconds: float = 0.0  # torchtpu's host work to run a compiled graph (guards, wrappers) ...
    graph_array_seconds: float = 0.0  # ... and for each array it takes or returns

    def matmul_rate(self, op: Op) -> float:
        """A product's FLOP/s: that of a square product as big, or of a thin one as narrow, whichever is less."""
        rate = _interpolate(self._curve(self.matmul, op.matmul_dtype), op.matmul_flops)
        if self.skinny_matmul and op.matmul_elements:
            intensity = op.matmul_flops / op.matmul_elements
            rate = min(rate, _interpolate(self._curve(self.skinny_matmul, op.matmul_dtype), intensity))
        if self.convolution and op.conv_narrowness:  # convolutions over few channels run far slower
            rate = min(rate, _interpolate(self.convolution, op.conv_narrowness))
        return rate

    @staticmethod
    def _curve(curves: dict, dtype: str) -> list:
        if dtype in curves:
            return curves[dtype]
        return curves["bf16" if "bf16" in curves else next(iter(curves))]  # f16 and the rest: half precision

    def bandwidth_at(self, nbytes: float) -> float:
        return _interpolate(self.bandwidth, nbytes)


def _interpolate(curve: list, x: float) -> float:
    """Piecewise linear in log(x), flat beyond the ends."""
    points = sorted(curve)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            share = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + share * (y1 - y0)
    return points[-1][1]


TPU_PROGRAM_SECONDS = 10e-6  # an assumption, not a measurement: launching one program from the host


def chip_target(chip) -> Target:
    """A TPU generation from the chip table.  An f32 product runs as 1, 3 or 6 bf16 passes
    (precision DEFAULT, HIGH, HIGHEST; torchtpu defaults to HIGHEST)."""
    flat = lambda rate: [(1.0, rate)]  # noqa: E731
    matmul = {"bf16": flat(chip.bf16_flops), "f16": flat(chip.bf16_flops), "s8": flat(chip.int8_ops),
              "u8": flat(chip.int8_ops), "f32": flat(chip.bf16_flops)}
    if chip.fp8_flops:
        matmul.update({dtype: flat(chip.fp8_flops) for dtype in ("f8e4m3fn", "f8e5m2")})
    return _TpuTarget(chip.name, matmul, flat(chip.hbm_bandwidth), math.inf, 0.0, TPU_PROGRAM_SECONDS,
                      chip.bf16_flops)


class _TpuTarget(Target):
    def matmul_rate(self, op: Op) -> float:
        passes = MXU_PASSES.get(op.precision, 6) if op.matmul_dtype == "f32" else 1
        return super().matmul_rate(op) / passes


def target(name: str = "v5e", calibration: str | None = None) -> Target:
    """``"host"`` (this machine, calibrated) or a TPU generation named in ``chips.py``."""
    if name == HOST:
        return host_target(calibrate(calibration))
    from . import chips

    return chip_target(chips.chip(name))


# ---- calibration: this machine's rates, measured with jax -------------------------------------------------

MATMUL_SIZES = {"f32": (64, 128, 256, 512, 1024), "bf16": (64, 256, 512)}  # square products, n x n x n
COPY_BYTES = (64 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20, 128 << 20)  # each array; the op moves twice this
THIN_ROWS, THIN_SIZES = 8192, (8, 32, 128, 512)
REDUCE_LENGTHS = (4, 64, 2048)
CONV_CHANNELS = (3, 16, 64)
TRANSPOSE_SIZES = (256, 1024, 2048)
GRAPH_OUTPUTS = 33
CALIBRATION_VERSION = 10  # part of the cache key: a new version of what is measured measures again
FRESH_BYTES = 64 << 20
FRESH_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit machines


def _best_seconds(fn, *args, budget: float = 0.15) -> float:
    """A fast wall time of ``fn(*args)`` (jitted; the first call compiles) in ``budget`` seconds: the
    lower quartile of the runs.  Not the median, since the machine is shared and an undisturbed run
    says what it can do; not the fastest either, which may be an outlier of the clock."""
    import time

    fn(*args).block_until_ready()
    times, spent = [], 0.0
    while len(times) < 3 or (spent < budget and len(times) < 200):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return sorted(times)[len(times) // 4]


def _product_rate(m: int, k: int, n: int, dtype_name: str, launch: float) -> float:
    """FLOP/s of one (m, k) x (k, n) product."""
    import jax
    import jax.numpy as jnp

    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    product = jax.jit(lambda a, b: jnp.dot(a, b, precision="highest"))
    seconds = _best_seconds(product, jnp.ones((m, k), dtype), jnp.ones((k, n), dtype))
    return 2.0 * m * k * n / _less_launch(seconds, launch)


def _never_slower_when_bigger(curve: list) -> list:
    """A bigger product does not run slower than a smaller one: a long measurement that the machine's
    other work interrupted is not believed."""
    best, monotone = 0.0, []
    for x, rate in sorted(curve):
        best = max(best, rate)
        monotone.append((x, best))
    return monotone


def _measure_matmul(dtype_name: str, launch: float) -> list:
    """Square products: [(flops, FLOP/s)], small ones being slower."""
    return _never_slower_when_bigger(
        [(2.0 * n**3, _product_rate(n, n, n, dtype_name, launch)) for n in MATMUL_SIZES[dtype_name]])


def _measure_convolution(launch: float) -> list:
    """3x3 convolutions (f32, NHWC) over CONV_CHANNELS input channels: [(min(rows, depth), FLOP/s)]."""
    import jax
    import jax.numpy as jnp

    conv = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest"))
    curve = []
    for channels in CONV_CHANNELS:
        x, w = jnp.ones((16, 32, 32, channels)), jnp.ones((3, 3, channels, 32))
        seconds = _less_launch(_best_seconds(conv, x, w), launch)
        curve.append((9.0 * channels, 2.0 * 16 * 32 * 32 * 9 * channels * 32 / seconds))
    return curve


def _measure_skinny_matmul(dtype_name: str, launch: float) -> list:
    """Long, thin products (THIN_ROWS x s by s x s): [(flops per element of operands and result, FLOP/s)].
    A convolution over few channels is such a product, and runs far below the square rate."""
    curve = []
    for s in THIN_SIZES:
        intensity = 2.0 * THIN_ROWS * s * s / (2 * THIN_ROWS * s + s * s)
        curve.append((intensity, _product_rate(THIN_ROWS, s, s, dtype_name, launch)))
    return _never_slower_when_bigger(curve)


def _scale_seconds(nbytes: int, donate: bool) -> float:
    """Median seconds of ``x * 2 + 1`` (one read, one write: a single loop fusion) over ``nbytes`` of f32.
    Donated, the result reuses the input's buffer; otherwise each run writes to new memory."""
    import jax
    import jax.numpy as jnp

    scale = jax.jit(lambda x: x * 2 + 1, donate_argnums=(0,) if donate else ())
    x = jnp.ones(nbytes // 4, jnp.float32)
    if not donate:
        return _best_seconds(scale, x)
    state = [x]
    return _best_seconds(lambda: _donated_step(scale, state))


def _donated_step(scale, state):
    state[0] = scale(state[0])
    return state[0]


def _measure_transposes(launch: float) -> list:
    """Square f32 transposes: [(bytes moved, bytes/s)]."""
    import jax
    import jax.numpy as jnp

    transpose = jax.jit(lambda x: x.T.copy())
    curve = []
    for n in TRANSPOSE_SIZES:
        nbytes = 2.0 * 4 * n * n
        curve.append((nbytes, nbytes / _less_launch(_best_seconds(transpose, jnp.ones((n, n), jnp.float32)), launch)))
    return curve


def _measure_bandwidth(launch: float) -> list:
    return [(2.0 * nbytes, 2.0 * nbytes / _less_launch(_scale_seconds(nbytes, donate=True), launch))
            for nbytes in COPY_BYTES]


def _measure_fresh_memory() -> float:
    """Seconds per byte that writing to newly mapped memory adds (page faults): by default glibc maps an
    allocation of 32 MiB or more afresh each time (its largest mmap threshold).  Smaller buffers it
    recycles, at least in the steady state of a training step (a lone program allocating several of them
    may fault too).  Where torchtpu made malloc keep its memory (the ``reuse_host_memory`` setting, on by
    default on XLA's CPU backend) the two runs measured here cost the same, and the term is about 0."""
    fresh, reused = _scale_seconds(FRESH_BYTES, donate=False), _scale_seconds(FRESH_BYTES, donate=True)
    return max(0.0, fresh - reused) / FRESH_BYTES


def _less_launch(seconds: float, launch: float) -> float:
    """An op's own time: each measurement is a one-op program, and inside a step ops pay no launch."""
    return max(seconds - launch, seconds / 10)


def _one_output(x):
    return x + 1


def _many_outputs(x):
    return [x + i for i in range(GRAPH_OUTPUTS)]


def _measure_graph_overhead(launch: float) -> tuple[float, float]:
    """torchtpu's host work per compiled graph, and per array it takes or returns (wrapping a result in a
    tensor, writing back a mutated input): two tiny torch.compile graphs, one output and many."""
    import time

    import torch

    x = torch.zeros(4, device="tpu")
    seconds = []
    for fn in (_one_output, _many_outputs):
        compiled = torch.compile(fn, backend="tpu")
        times = []
        for _ in range(40):
            start = time.perf_counter()
            compiled(x)
            torch.tpu.synchronize()
            times.append(time.perf_counter() - start)
        seconds.append(sorted(times)[len(times) // 4])
    per_array = max(0.0, (seconds[1] - seconds[0]) / (GRAPH_OUTPUTS - 1))
    return max(0.0, seconds[0] - launch - 3 * per_array), per_array  # 3 arrays: x, the result, the seed


def _measure_overheads() -> tuple[float, float]:
    """Seconds per program launch and per top-level op."""
    import jax
    import jax.numpy as jnp

    tiny = jnp.ones(8, jnp.float32)
    launch = _best_seconds(jax.jit(lambda x: x + 1), tiny)

    def chain(x):  # 64 ops the compiler may not fuse: the barrier keeps each one a kernel of its own
        for _ in range(64):
            x = jax.lax.optimization_barrier(jnp.sin(x) + 1)
        return x

    return launch, max(0.0, (_best_seconds(jax.jit(chain), tiny) - launch) / 64)


def _mixed(x):
    """Forty cheap vector ops per element, one loop fusion."""
    import jax.numpy as jnp

    for _ in range(8):
        x = jnp.where(x > 0.5, x * 1.01 + 0.1, x - 0.2)
    return x


def _measure_vector(launch: float) -> dict:
    """Per second, inside fusions and counted as the model counts them (``hlo_ops``): vector ops,
    transcendentals, gathered elements, and reduced elements by the length of the reduction; on arrays
    that stay in cache, so that memory is not what is measured."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(256 << 10, jnp.float32)
    indices = (jnp.arange(x.size, dtype=jnp.int32) * 7919) % x.size  # scattered addresses

    def rate(fn, *args, count):
        program = jax.jit(fn).lower(*args).compile()
        return sum(count(op) for op in hlo_ops(program.as_text())) / _less_launch(_best_seconds(program, *args), launch)

    reduce = [(length, rate(lambda x, n=length: jnp.sum(x.reshape(-1, n), axis=1), x,
                            count=lambda op: sum(e for e, _ in op.reductions)))
              for length in REDUCE_LENGTHS]
    return {"elementwise_per_s": rate(_mixed, x, count=lambda op: op.elementwise),
            "transcendentals_per_s": rate(jnp.exp, x, count=lambda op: op.transcendentals),
            "gathered_per_s": rate(lambda x, i: x[i], x, indices, count=lambda op: op.gathered), "reduce": reduce}


def _calibration_key() -> str:
    import os
    import platform

    import jax

    processor = platform.processor() or platform.machine()
    return f"v{CALIBRATION_VERSION}|{platform.node()}|{processor}|{os.cpu_count()} cpus|jax {jax.__version__}"


def _default_path():
    import pathlib

    return pathlib.Path.home() / ".cache" / "torchtpu" / "calibration.json"


def measure_host() -> dict:
    """Measure this machine now (about ten seconds): products, convolutions, bandwidths, vector work,
    the cost of new memory and the fixed costs.  Every op's own time has the launch subtracted."""
    launch, per_op = _measure_overheads()
    graph, graph_array = _measure_graph_overhead(launch)
    return {"graph_seconds": graph, "graph_array_seconds": graph_array,"matmul": {dtype: _measure_matmul(dtype, launch) for dtype in MATMUL_SIZES},
            "skinny_matmul": {dtype: _measure_skinny_matmul(dtype, launch) for dtype in MATMUL_SIZES},
            "convolution": _measure_convolution(launch), "bandwidth": _measure_bandwidth(launch),
            "transpose_bandwidth": _measure_transposes(launch), "fresh_seconds_per_byte": _measure_fresh_memory(),
            **_measure_vector(launch), "program_seconds": launch, "op_seconds": per_op}


def calibrate(path=None, refresh: bool = False) -> dict:
    """This machine's figures: read from ``path`` (default ``~/.cache/torchtpu/calibration.json``) when
    measured before on the same machine and jax version, else measured now and saved there."""
    import json
    import pathlib

    path = pathlib.Path(path) if path else _default_path()
    saved = json.loads(path.read_text()) if path.exists() else {}
    key = _calibration_key()
    if refresh or key not in saved:
        saved[key] = measure_host()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, indent=1))
    return saved[key]


def host_target(figures: dict) -> Target:
    curves = lambda name: {dtype: [tuple(p) for p in c] for dtype, c in figures[name].items()}  # noqa: E731
    matmul = curves("matmul")
    return Target(HOST, matmul, [tuple(p) for p in figures["bandwidth"]], figures["transcendentals_per_s"],
                  figures["op_seconds"], figures["program_seconds"], max(rate for _, rate in matmul["f32"]),
                  figures["fresh_seconds_per_byte"], FRESH_THRESHOLD, curves("skinny_matmul"),
                  figures["elementwise_per_s"], figures["gathered_per_s"], [tuple(p) for p in figures["reduce"]],
                  [tuple(p) for p in figures["convolution"]], [tuple(p) for p in figures["transpose_bandwidth"]],
                  figures["graph_seconds"], figures["graph_array_seconds"])


# ---- the prediction ----------------------------------------------------------------------------------------


def op_seconds(op: Op, machine: Target) -> float:
    """The roofline of one op: the slower of its work (products, vector work, transcendentals) and its
    memory traffic, plus the fixed cost of running an op."""
    return op.repeats * (max(_compute_seconds(op, machine), _memory_seconds(op, machine)) + machine.op_seconds)


def _compute_seconds(op: Op, machine: Target) -> float:
    products = op.matmul_flops / machine.matmul_rate(op) if op.matmul_flops else 0.0
    vector = max(op.elementwise / machine.elementwise_per_s, op.transcendentals / machine.transcendentals_per_s)
    vector += op.gathered / machine.gathered_per_s
    if machine.reduce:
        vector += sum(elements / _interpolate(machine.reduce, length) for elements, length in op.reductions)
    return max(products, vector)


def _memory_seconds(op: Op, machine: Target) -> float:
    """Bytes just written by earlier ops move at the bandwidth of their size (caches help small ones);
    the program's arguments come from memory, at the bandwidth of the largest arrays."""
    if op.transposes and machine.transpose_bandwidth:
        return op.bytes / _interpolate(machine.transpose_bandwidth, op.bytes)
    warm = op.bytes - op.cold_bytes
    seconds = op.cold_bytes / machine.bandwidth_at(math.inf) if op.cold_bytes else 0.0
    return seconds + (warm / machine.bandwidth_at(warm) if warm else 0.0)


def program_seconds(program: Program, machine: Target) -> float:
    fresh = program.fresh_bytes(machine.fresh_threshold) * machine.fresh_seconds_per_byte
    host = machine.graph_seconds + machine.graph_array_seconds * (program.arguments + len(program.output_arrays))
    return machine.program_seconds + host + fresh + sum(op_seconds(op, machine) for op in program.ops)


@dataclasses.dataclass
class ProgramPrediction:
    name: str
    flops: float
    bytes_accessed: float
    seconds: float
    bound: str  # "compute" or "memory": which side of the roofline most of its time is on


@dataclasses.dataclass
class Prediction:
    """A step's predicted time on ``chip``: the sum over the programs one step runs."""

    chip: str
    flops: float  # per step, XLA's count
    bytes_accessed: float  # per step, XLA's count
    seconds: float  # predicted per step
    mfu: float  # flops / (seconds * the chip's peak), at the predicted time
    programs: list
    peak_memory_bytes: float  # the largest program's arguments + outputs + temporaries
    measured_seconds: float | None = None  # the step measured on this machine (predict(..., measure=True))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        peak = "the best f32 matmul rate" if self.chip == HOST else "the bf16 peak"
        lines = [f"predicted on {self.chip} (MFU: of {peak})"]
        lines += [f"{p.name:>12s}  {p.flops / 1e9:9.3f} GFLOP  {p.bytes_accessed / 1e6:9.1f} MB  "
                  f"{p.seconds * 1e3:9.3f} ms  {p.bound}-bound" for p in self.programs]
        lines.append(f"{'step':>12s}  {self.flops / 1e9:9.3f} GFLOP  {self.bytes_accessed / 1e6:9.1f} MB  "
                     f"{self.seconds * 1e3:9.3f} ms  MFU {self.mfu:.1%} on {self.chip}")
        if self.measured_seconds:
            lines.append(f"{'measured':>12s}  {self.measured_seconds * 1e3:9.3f} ms on this machine "
                         f"(predicted/measured {self.seconds / self.measured_seconds:.2f} for the host)")
        return "\n".join(lines)


def _bound(program: Program, machine: Target) -> str:
    compute = sum(op.repeats * _compute_seconds(op, machine) for op in program.ops)
    memory = sum(op.repeats * _memory_seconds(op, machine) for op in program.ops)
    return "compute" if compute >= memory else "memory"


def predict_programs(programs: list, chip: str = "v5e", calibration=None) -> Prediction:
    """Predict a step that runs each of ``programs`` once, on ``chip`` ("host" or a TPU generation)."""
    machine = target(chip, calibration)
    parts = [ProgramPrediction(p.name, p.flops, p.bytes_accessed, program_seconds(p, machine), _bound(p, machine))
             for p in programs]
    seconds = sum(p.seconds for p in parts)
    flops = sum(p.flops for p in programs)
    peak = max((sum(p.memory.get(k, 0) for k in ("argument", "output", "temp")) - p.memory.get("alias", 0)
                for p in programs), default=0)
    return Prediction(machine.name, flops, sum(p.bytes_accessed for p in programs), seconds,
                      flops / (seconds * machine.peak_flops) if seconds else 0.0, parts, peak)


class Capture:
    """Collects the programs ``torch.compile(backend="tpu")`` compiles while it is open.  A graph
    compiled again (a recompile: same name, same number of parameters) replaces its earlier version."""

    def __init__(self):
        self.programs: list[Program] = []
        self._arities: list[int] = []  # each program's parameter count, to recognise a recompile

    def __enter__(self):
        from ...runtime import compile_cache

        self._undo = compile_cache.observe(self._seen)
        return self

    def __exit__(self, *exc):
        self._undo()

    def _seen(self, name, lowered, compiled, seconds) -> None:
        program = program_costs(compiled, name)
        arity = program.arguments
        for i, old in enumerate(self.programs):
            if old.name == name and self._arities[i] == arity:
                self.programs[i] = program
                return
        self.programs.append(program)
        self._arities.append(arity)


def _parameter_count(text: str) -> int:
    layout = re.search(r"entry_computation_layout=\{\((.*?)\)->", text.split("\n", 1)[0])
    return len(_ARRAY.findall(layout.group(1))) if layout else 0


def _sync(result) -> None:
    import torch

    torch.tpu.synchronize()
    del result


def measure_step(step_fn, *inputs, steps: int = 5) -> float:
    """The best wall time of ``step_fn(*inputs)`` to a device sync over ``steps`` runs (compiled programs
    assumed warm): the best, as for the calibration, so that other work on the machine counts least."""
    import time

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _sync(step_fn(*inputs))
        times.append(time.perf_counter() - start)
    return min(times)


def predict(step_fn, *inputs, chip: str = "v5e", steps: int = 3, measure: bool = False,
            calibration=None) -> Prediction:
    """Run ``step_fn(*inputs)`` ``steps`` times (a ``torch.compile(backend="tpu")`` function, or one that
    calls one), capture the programs it compiles, and predict one step's time on ``chip``.  With
    ``measure=True`` the step is also timed here (``measured_seconds``), to compare with ``chip="host"``."""
    with Capture() as capture:
        for _ in range(steps):
            _sync(step_fn(*inputs))
    if not capture.programs:
        raise RuntimeError("no program was compiled while the step ran: is it a torch.compile(backend='tpu') "
                           "function, and was it compiled before predict() (then call torch._dynamo.reset())?")
    prediction = predict_programs(capture.programs, chip, calibration)
    if measure:
        prediction.measured_seconds = measure_step(step_fn, *inputs, steps=max(steps, 5))
    return prediction


# ---- the command ------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("script", nargs="?", help="a Python script whose torch.compile(backend='tpu') step to cost")
    parser.add_argument("script_args", nargs="...", help="arguments for the script")
    parser.add_argument("--chip", default="v5e", help="TPU generation (v4, v5e, v5p, v6e, v7x) or 'host'")
    parser.add_argument("--calibrate", action="store_true", help="measure this machine again and print its figures")
    parser.add_argument("--calibration", help="calibration file (default ~/.cache/torchtpu/calibration.json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    import json

    if args.calibrate or not args.script:
        figures = calibrate(args.calibration, refresh=args.calibrate)
        print(json.dumps(figures, indent=1) if args.json else _describe_host(figures))
        return 0
    target(args.chip, args.calibration)  # an unknown chip fails before the script runs
    programs = _run_script(args.script, args.script_args)
    results = {name: predict_programs(programs, name, args.calibration) for name in dict.fromkeys([args.chip, HOST])}
    if args.json:
        print(json.dumps({name: r.to_json() for name, r in results.items()}, indent=1))
    else:
        print("\n\n".join(r.summary() for r in results.values()))
    return 0


def _run_script(script: str, script_args: list) -> list:
    import runpy
    import sys

    saved = sys.argv
    sys.argv = [script, *script_args]
    try:
        with Capture() as capture:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    if not capture.programs:
        raise SystemExit(f"torchtpu tune cost: {script} compiled no torch.compile(backend='tpu') program")
    return capture.programs


def _rates(curve, label, unit: str = "GFLOP/s") -> str:
    """``curve`` as "label(x) rate unit, ...", rates in G per second."""
    return ", ".join(f"{label(x)} {rate / 1e9:.0f} {unit}" for x, rate in curve)


def _describe_host(figures: dict) -> str:
    mib = lambda nbytes: f"{nbytes / 2**20:.1f} MiB"  # noqa: E731
    lines = [f"matmul {dtype}: " + _rates(curve, lambda f: f"{round((f / 2) ** (1 / 3))}^3")
             for dtype, curve in figures["matmul"].items()]
    lines += [f"thin matmul {dtype}: " + _rates(zip(THIN_SIZES, (r for _, r in curve)), lambda s: f"{THIN_ROWS}x{s}")
              for dtype, curve in figures["skinny_matmul"].items()]
    lines.append("3x3 convolution f32: " + _rates(figures["convolution"], lambda depth: f"{depth / 9:.0f} channels"))
    lines.append("bandwidth: " + _rates(figures["bandwidth"], mib, "GB/s"))
    lines.append("transposes: " + _rates(figures["transpose_bandwidth"], mib, "GB/s"))
    lines.append("reductions: " + _rates(figures["reduce"], lambda n: f"{n:.0f} long", "G elements/s"))
    lines.append(f"torchtpu per compiled graph {figures['graph_seconds'] * 1e6:.0f} us, "
                 f"per array {figures['graph_array_seconds'] * 1e6:.1f} us")
    lines.append(f"new memory {figures['fresh_seconds_per_byte'] * 2**30 * 1e3:.0f} ms/GiB; "
                 f"program launch {figures['program_seconds'] * 1e6:.1f} us; "
                 f"per op {figures['op_seconds'] * 1e6:.2f} us; vector ops {figures['elementwise_per_s'] / 1e9:.1f} G/s; "
                 f"gathers {figures['gathered_per_s'] / 1e9:.2f} G/s; "
                 f"transcendentals {figures['transcendentals_per_s'] / 1e9:.2f} G/s")
    return "\n".join(lines)
