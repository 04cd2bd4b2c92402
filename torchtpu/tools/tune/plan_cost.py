"""Memory, compute and communication of one sharding plan for one training step.

A plan is a mesh (data replicate ``dp``, FSDP ``fsdp``, context ``cp``, tensor ``tp``, pipeline ``pp``;
expert parallel ``ep`` borrows chips from fsdp x cp x tp, as TorchTitan's does), a micro-batch size and an
activation checkpointing mode.  Devices are laid out tp innermost, then cp, fsdp, dp and pp outermost, so the
axes that talk most sit closest on the torus; ``plan_comm`` turns each axis's block into links.

Conventions follow TorchTitan's defaults: parameters, gradients and the reduction are float32, the compute
and the FSDP all-gathers bfloat16, AdamW (two float32 moments): 16 bytes of state per parameter.
"""

from __future__ import annotations

import dataclasses
import math

from . import plan_comm
from .chips import Chip
from .plan_model import ModelSpec

AC_MODES = ("none", "selective", "full")
STATE_BYTES = {"params": 4, "grads": 4, "optimizer": 8}  # per parameter: fp32 master, fp32 grad, AdamW moments
ACT_BYTES = 2  # bfloat16 activations
LOGIT_BYTES = 10  # per logit: bf16 output, fp32 copy for the loss, fp32 gradient


@dataclasses.dataclass(frozen=True)
class Layout:
    dp: int = 1
    fsdp: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    micro_batch: int = 1  # sequences per chip per forward (a pipeline micro-batch when pp > 1)
    ac: str = "none"

    @property
    def chips(self) -> int:
        return self.dp * self.fsdp * self.cp * self.tp * self.pp

    @property
    def shard_ways(self) -> int:
        """Chips one stage's parameters are sharded over (FSDP over dp_shard x cp, then tp)."""
        return self.fsdp * self.cp * self.tp

    def describe(self) -> str:
        axes = [f"{name}{value}" for name, value in
                (("dp", self.dp), ("fsdp", self.fsdp), ("cp", self.cp), ("tp", self.tp), ("pp", self.pp),
                 ("ep", self.ep)) if value > 1]
        return " ".join(axes) or "single"


@dataclasses.dataclass(frozen=True)
class Workload:
    model: ModelSpec
    chip: Chip
    chips: int
    global_batch: int  # sequences per optimizer step
    seq: int
    slice_chips: int = 0  # chips joined by ICI; 0: as many as the chip's largest slice allows
    memory_reserve: float = 0.1  # HBM kept free for XLA's buffers and fragmentation
    matmul_efficiency: float = 0.85  # the best fraction of peak a large matmul reaches
    overlap_efficiency: float = 0.9  # the share of compute time that can hide FSDP/CP/DP traffic

    @property
    def slice_size(self) -> int:
        limit = self.slice_chips or self.chip.max_slice_chips
        return min(self.chips, limit)


@dataclasses.dataclass
class Collective:
    name: str  # what it is for, e.g. "fsdp all-gather (dense)"
    kind: str  # plan_comm.KINDS
    axis: str
    nbytes: float  # per chip, NCCL's convention
    count: float  # per step
    ici_s: float  # one call
    dcn_s: float
    hidden: bool  # overlapped with compute

    @property
    def total_s(self) -> float:
        return self.count * (self.ici_s + self.dcn_s)


@dataclasses.dataclass
class Estimate:
    layout: Layout
    memory: dict  # bytes per chip by part
    memory_limit: float
    compute_s: float = 0.0
    exposed_comm_s: float = 0.0
    bubble_s: float = 0.0
    step_s: float = math.inf
    mfu: float = 0.0
    tokens_per_s: float = 0.0
    collectives: list = dataclasses.field(default_factory=list)
    rejected: str = ""  # why the plan cannot run; empty when it can

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return not self.rejected


# -- checks -------------------------------------------------------------------------------------------------

def structural_problem(work: Workload, lay: Layout) -> str:
    """Why ``lay`` cannot be built for ``work`` at all (empty when it can)."""
    m = work.model
    data_ways = lay.dp * lay.fsdp
    checks = [
        (lay.chips != work.chips, f"axes multiply to {lay.chips}, not {work.chips} chips"),
        (lay.ac not in AC_MODES, f"activation checkpointing {lay.ac!r} is not one of {AC_MODES}"),
        (work.global_batch % data_ways != 0, f"global batch {work.global_batch} does not split over "
                                             f"{data_ways} data-parallel ranks"),
        (work.global_batch % data_ways == 0 and (work.global_batch // data_ways) % lay.micro_batch != 0,
         f"micro-batch {lay.micro_batch} does not divide the local batch"),
        (work.seq % lay.cp != 0, f"sequence {work.seq} does not split over cp={lay.cp}"),
        (m.heads % lay.tp != 0, f"{m.heads} heads do not split over tp={lay.tp}"),
        (m.kv_heads % lay.tp != 0 and lay.tp % m.kv_heads != 0, f"{m.kv_heads} kv heads and tp={lay.tp}"),
        (lay.ep > 1 and not m.is_moe, "expert parallelism on a dense model"),
        (m.is_moe and m.experts % lay.ep != 0, f"{m.experts} experts do not split over ep={lay.ep}"),
        (lay.shard_ways % lay.ep != 0, f"ep={lay.ep} must divide fsdp x cp x tp = {lay.shard_ways}"),
        (lay.pp > m.layers, f"pp={lay.pp} exceeds {m.layers} layers"),
        (lay.pp > 1 and microbatches(work, lay) < lay.pp, "fewer micro-batches than pipeline stages"),
        (lay.tp * lay.cp > work.slice_size, "tensor or context parallelism across slices (DCN)"),
        (lay.ep > work.slice_size, "expert parallelism across slices (DCN)"),
    ]
    return next((reason for failed, reason in checks if failed), "")


def microbatches(work: Workload, lay: Layout) -> int:
    return work.global_batch // (lay.dp * lay.fsdp) // lay.micro_batch


# -- memory -------------------------------------------------------------------------------------------------

def stage_layers(model: ModelSpec, lay: Layout) -> int:
    return math.ceil(model.layers / lay.pp)


def stage_params(model: ModelSpec, lay: Layout) -> tuple[float, float]:
    """(dense, routed-expert) parameters of the largest pipeline stage, unsharded."""
    share = stage_layers(model, lay) / model.layers
    embeddings = model.embedding_params() if lay.pp == 1 else model.vocab * model.hidden
    dense_layers = model.dense_params() - model.embedding_params()
    return dense_layers * share + embeddings, model.routed_expert_params() * share


def layer_activation_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """Bytes one layer keeps for its backward pass, no checkpointing, flash attention (no score matrix);
    tensor parallelism with sequence parallelism divides all of it by tp."""
    h, q, kv = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim
    attention = 2 * h + q + 2 * kv + 2 * q  # norm in/out, q k v, attention output, o-proj input
    if model.is_moe:
        k = model.active_experts
        mlp = h + 2 * k * h + 3 * k * model.moe_intermediate + model.experts  # routed copies, gate/up/act, router
    else:
        mlp = h + 3 * model.intermediate
    return tokens * (attention + mlp) * ACT_BYTES / tp


def activation_bytes(work: Workload, lay: Layout) -> float:
    model = work.model
    tokens = lay.micro_batch * work.seq / lay.cp
    full = layer_activation_bytes(model, tokens, lay.tp)
    kept_input = tokens * model.hidden * ACT_BYTES / lay.tp
    layers = stage_layers(model, lay)
    per_microbatch = {"none": layers * full,
                      "selective": layers * (full + kept_input) / 2 + full / 2,
                      "full": layers * kept_input + full}[lay.ac]
    in_flight = min(lay.pp, microbatches(work, lay)) if lay.pp > 1 else 1  # 1F1B: the first stage holds pp
    logits = tokens * model.vocab / lay.tp * LOGIT_BYTES if lay.pp == 1 else 0.0
    return per_microbatch * in_flight + logits


def memory(work: Workload, lay: Layout) -> dict:
    """Bytes per chip: sharded state, the layers gathered for compute, activations."""
    dense, experts = stage_params(work.model, lay)
    shard = (dense + experts) / lay.shard_ways
    parts = {name: shard * size for name, size in STATE_BYTES.items()}
    layer_dense = dense / stage_layers(work.model, lay) / lay.tp
    layer_experts = experts / stage_layers(work.model, lay) / lay.ep
    gathered = layer_dense + layer_experts
    # two layers gathered in bf16 (the current one and the prefetched next) and one layer's fp32 gradient
    parts["gathered"] = (2 * 2 + 4) * gathered if lay.shard_ways > 1 else 0.0
    parts["activations"] = activation_bytes(work, lay)
    return parts


# -- compute ------------------------------------------------------------------------------------------------

def matmul_efficiency(work: Workload, tokens: float, k: float, n: float) -> float:
    """The fraction of peak a [tokens, k] x [k, n] bf16 matmul reaches: the roofline, capped."""
    if tokens <= 0 or k <= 0 or n <= 0:
        return work.matmul_efficiency
    intensity = tokens * k * n / (tokens * k + k * n + tokens * n)  # FLOPs per byte, 2 bytes per element
    return work.matmul_efficiency * min(1.0, intensity / work.chip.ridge_flops_per_byte)


def compute_seconds(work: Workload, lay: Layout) -> float:
    """One chip's compute for one step: matmuls at their roofline efficiency, recomputation, vector work."""
    model, chip = work.model, work.chip
    tokens_step = work.global_batch * work.seq
    model_flops = model.flops_per_token(work.seq) * tokens_step
    head_flops = 6 * model.vocab * model.hidden * tokens_step
    recompute = (model_flops - head_flops) / 3 * {"none": 0.0, "selective": 0.5, "full": 1.0}[lay.ac]
    tokens_mb = lay.micro_batch * work.seq / lay.cp  # one chip's tokens per micro-batch
    dense_eff = matmul_efficiency(work, tokens_mb, model.hidden, model.heads * model.head_dim / lay.tp)
    expert_share, expert_eff = 0.0, dense_eff
    if model.is_moe:
        routed = model.moe_layers * model.active_experts * model.expert_params() * 6 * tokens_step
        expert_share = routed / model_flops
        tokens_per_expert = tokens_mb / lay.tp * lay.ep * model.active_experts / model.experts
        expert_eff = matmul_efficiency(work, tokens_per_expert, model.hidden, model.moe_intermediate)
    flops_chip = (model_flops + recompute) / work.chips
    matmul_s = flops_chip * ((1 - expert_share) / dense_eff + expert_share / expert_eff) / chip.bf16_flops
    return matmul_s + vector_seconds(work, lay)


def vector_seconds(work: Workload, lay: Layout) -> float:
    """Memory-bound work: norms, activations, rotary, residuals, MoE permutation, the optimizer update."""
    model = work.model
    tokens_chip = work.global_batch * work.seq / (lay.dp * lay.fsdp * lay.cp * lay.tp)
    per_token_layer = 24 * model.hidden * ACT_BYTES  # read+write of ~6 hidden-sized tensors, fwd and bwd
    if model.is_moe:
        per_token_layer += 8 * model.active_experts * model.hidden * ACT_BYTES  # gather/scatter of routed copies
    layer_bytes = tokens_chip * per_token_layer * stage_layers(model, lay)
    dense, experts = stage_params(model, lay)
    optimizer_bytes = (dense + experts) / lay.shard_ways * 28  # read param, grad, 2 moments; write 3
    return (layer_bytes + optimizer_bytes) / work.chip.hbm_bandwidth


# -- communication ------------------------------------------------------------------------------------------

def collectives(work: Workload, lay: Layout) -> list[Collective]:
    """Every collective of one step, with its count and its time per call on this layout."""
    model, chip = work.model, work.chip
    shape = plan_comm.torus_shape(work.slice_size, chip.torus_dims)
    m, layers = microbatches(work, lay), stage_layers(model, lay)
    moe_layers = math.ceil(model.moe_layers / lay.pp)
    dense, experts = stage_params(model, lay)
    tokens_mb = lay.micro_batch * work.seq / lay.cp
    out = []

    def add(name, kind, axis, stride, size, nbytes, count, hidden):
        if size <= 1 or count <= 0:
            return
        where = plan_comm.span(stride, size, work.slice_size, shape)
        ici, dcn = plan_comm.collective_time(kind, nbytes, where, chip)
        out.append(Collective(name, kind, axis, nbytes, count, ici, dcn, hidden))

    fsdp_group = lay.fsdp * lay.cp
    layer_dense = dense / layers / lay.tp
    add("fsdp all-gather (dense, bf16)", "all_gather", "fsdp", lay.tp, fsdp_group, layer_dense * 2, 2 * layers * m, True)
    add("fsdp reduce-scatter (dense, fp32)", "reduce_scatter", "fsdp", lay.tp, fsdp_group, layer_dense * 4,
        layers * m, True)
    if model.is_moe:
        efsdp = lay.shard_ways // lay.ep
        layer_experts = experts / max(moe_layers, 1) / lay.ep
        add("fsdp all-gather (experts, bf16)", "all_gather", "efsdp", lay.ep, efsdp, layer_experts * 2,
            2 * moe_layers * m, True)
        add("fsdp reduce-scatter (experts, fp32)", "reduce_scatter", "efsdp", lay.ep, efsdp, layer_experts * 4,
            moe_layers * m, True)
        routed = tokens_mb / lay.tp * model.active_experts * model.hidden * ACT_BYTES
        add("expert all-to-all (dispatch+combine)", "all_to_all", "ep", 1, lay.ep, routed, 4 * moe_layers * m, False)
    hidden_bytes = tokens_mb * model.hidden * ACT_BYTES
    add("tp all-gather (sequence parallel)", "all_gather", "tp", 1, lay.tp, hidden_bytes, 4 * layers * m, False)
    add("tp reduce-scatter (sequence parallel)", "reduce_scatter", "tp", 1, lay.tp, hidden_bytes, 4 * layers * m,
        False)
    kv_bytes = tokens_mb * lay.cp * 2 * model.kv_heads * model.head_dim * ACT_BYTES / min(lay.tp, model.kv_heads)
    add("cp all-gather (keys, values)", "all_gather", "cp", lay.tp, lay.cp, kv_bytes, 2 * layers * m, True)
    add("cp reduce-scatter (key, value grads)", "reduce_scatter", "cp", lay.tp, lay.cp, kv_bytes, layers * m, True)
    if lay.pp > 1:  # each stage boundary: activations forward, their gradients back
        add("pp send/recv (activations)", "send_recv", "pp", lay.tp * lay.cp * lay.fsdp * lay.dp, 2,
            hidden_bytes / lay.tp, 2 * m, False)
    grad_shard = (dense + experts) / lay.shard_ways * 4
    add("dp all-reduce (gradient shards, fp32)", "all_reduce", "dp", lay.shard_ways, lay.dp, grad_shard, 1, True)
    return out


def exposed_comm(work: Workload, lay: Layout, comms: list[Collective], compute_s: float) -> float:
    """Communication left on the critical path.  FSDP and CP traffic of a micro-batch hides behind its
    compute (prefetch one layer ahead), ICI and DCN in parallel, except the first layer's gather; the data
    parallel all-reduce hides behind the last backward; tensor, expert and pipeline traffic waits."""
    m = microbatches(work, lay)
    per_mb_compute = compute_s / m
    inner = [c for c in comms if c.hidden and c.axis != "dp"]
    ici = sum(c.count * c.ici_s for c in inner) / m
    dcn = sum(c.count * c.dcn_s for c in inner) / m
    first_gather = ici / (3 * stage_layers(work.model, lay)) if inner else 0.0
    window = work.overlap_efficiency * per_mb_compute
    exposed = m * (max(0.0, max(ici, dcn) - window) + first_gather)
    exposed += sum(c.total_s for c in comms if not c.hidden)
    exposed += sum(max(0.0, c.total_s - window * 2 / 3) for c in comms if c.axis == "dp")
    return exposed


# -- the whole estimate -------------------------------------------------------------------------------------

def estimate(work: Workload, lay: Layout) -> Estimate:
    """Memory, time and MFU of ``lay``; ``rejected`` says why it cannot run (structure or memory)."""
    limit = work.chip.hbm_bytes * (1 - work.memory_reserve)
    problem = structural_problem(work, lay)
    if problem:
        return Estimate(lay, {}, limit, rejected=problem)
    result = Estimate(lay, memory(work, lay), limit)
    if result.memory_total > limit:
        gib = 2**30
        parts = ", ".join(f"{name} {value / gib:.1f}" for name, value in result.memory.items())
        result.rejected = (f"out of memory: needs {result.memory_total / gib:.1f} GiB per chip, "
                           f"{limit / gib:.1f} GiB usable ({parts})")
        return result  # no time for a plan that cannot run
    result.compute_s = compute_seconds(work, lay)
    result.collectives = collectives(work, lay)
    result.exposed_comm_s = exposed_comm(work, lay, result.collectives, result.compute_s)
    m = microbatches(work, lay)
    busy = result.compute_s + result.exposed_comm_s
    result.bubble_s = busy * (lay.pp - 1) / m  # 1F1B: (m + pp - 1) micro-batch slots for m of work
    result.step_s = busy + result.bubble_s
    model_flops = work.model.flops_per_token(work.seq) * work.global_batch * work.seq
    result.mfu = model_flops / (work.chips * work.chip.bf16_flops * result.step_s)
    result.tokens_per_s = work.global_batch * work.seq / result.step_s
    return result
