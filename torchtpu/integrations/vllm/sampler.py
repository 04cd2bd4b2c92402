"""Sampling on tpu for vLLM: the LM head and the sampler as compiled programs per request bucket.

vLLM's sampler is a few dozen small ops whose shapes follow the number of
requests in the step: op by op, every new batch size compiles new programs
and each op is a launch. Here a step's sample rows are padded to a *request
bucket* (a power of two, at least 8, at most ``max_num_seqs``): the LM head
over those rows is one program per (token bucket, request bucket), and the
sampler one per (request bucket, kind), all compiled at start-up. What varies
per request (temperature, top-k, top-p, seeds) enters as arrays built on the
host, never as constants of a program.

The sampler's kinds: greedy or random (with or without top-k/top-p), with or
without logprobs (the ``max_logprobs`` best, sliced on the host to what the
step asked). Requests that need more (penalties, bad words, allowed tokens,
logit bias, min-p, min tokens, custom logits processors, logprobs of given
tokens, processed logprobs) make the step run vLLM's own sampler, op by op.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor, MinPLogitsProcessor,
                                                     MinTokensLogitsProcessor)
from vllm.v1.sample.metadata import SamplingMetadata

from torchtpu.api.bucketing import bucket_size
from torchtpu.core import tensor
from torchtpu.runtime import rng

from .compiled import check_same_rows, compile_per_bucket

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger, which prints INFO

# vLLM's threshold: a request with a lower temperature samples greedily.
SAMPLING_EPS = 1e-5
SMALLEST_REQUEST_BUCKET = 8
# vLLM's built-in logits processors, and when each has work to do.
BUILTIN_PROCESSOR_ACTIVE = {
    MinPLogitsProcessor: lambda p: p.min_p_count > 0,
    LogitBiasLogitsProcessor: lambda p: bool(p.biases),
    MinTokensLogitsProcessor: lambda p: bool(p.min_toks),
}


def request_bucket(num_reqs: int, limit: int) -> int:
    """The padded row count of a step's sampling: a power of two (at least 8), at most ``limit``."""
    return min(max(bucket_size(num_reqs), SMALLEST_REQUEST_BUCKET), limit)


def request_buckets(limit: int) -> list[int]:
    return sorted({request_bucket(n, limit) for n in range(1, limit + 1)})


@dataclass(frozen=True)
class SamplingKind:
    """What a step's compiled sampler computes (one program per kind and request bucket)."""
    random: bool = False          # some request samples (temperature >= SAMPLING_EPS)
    top_k_top_p: bool = False     # some random request keeps only its top-k / top-p tokens
    logprobs: int | None = None   # how many top logprobs to compute, None for none


@dataclass
class HostSamplingMetadata(SamplingMetadata):
    """vLLM's sampling metadata whose per-request tensors are the input batch's host
    arrays: the compiled sampler uploads them once, padded; nothing is copied to the
    device per request count."""


# ---- which steps the compiled sampler takes -----------------------------------------------------


def vllm_sampler_reason(batch, logprobs_mode: str) -> str | None:
    """Why this batch needs vLLM's own sampler, or None when the compiled one computes it."""
    processors = [p for p in batch.logitsprocs.all
                  if BUILTIN_PROCESSOR_ACTIVE.get(type(p), lambda _: True)(p)]
    reasons = {
        "penalties": not batch.no_penalties,
        "bad words": bool(batch.bad_words_token_ids),
        "allowed token ids": not batch.no_allowed_token_ids,
        "logprobs of given tokens": bool(batch.logprob_token_ids),
        "logprobs of the whole vocabulary": batch.max_num_logprobs == -1,
        f"logprobs mode {logprobs_mode}": logprobs_mode != "raw_logprobs" and batch.max_num_logprobs is not None,
        "logits processors " + ", ".join(type(p).__name__ for p in processors): bool(processors),
        "thinking budgets": batch.thinking_budget_state_holder is not None
                            and batch.thinking_budget_state_holder.has_tracked_requests(),
        "speculative tokens": bool(batch.spec_token_ids and any(batch.spec_token_ids)),
    }
    named = [name for name, used in reasons.items() if used]
    return ", ".join(named) or None


def make_sampling_metadata(batch, original, logprobs_mode: str) -> SamplingMetadata:
    """``InputBatch._make_sampling_metadata`` for tpu: host arrays when the compiled
    sampler applies, vLLM's device copies (``original()``) when its own sampler runs."""
    if vllm_sampler_reason(batch, logprobs_mode):
        return original()
    n = batch.num_reqs
    host = {name: getattr(batch, f"{name}_cpu_tensor")[:n]
            for name in ("temperature", "top_p", "top_k", "frequency_penalties", "presence_penalties",
                         "repetition_penalties")}
    return HostSamplingMetadata(
        temperature=None if batch.all_greedy else host["temperature"], all_greedy=batch.all_greedy,
        all_random=batch.all_random, top_p=None if batch.no_top_p else host["top_p"],
        top_k=None if batch.no_top_k else host["top_k"], generators=batch.generators,
        max_num_logprobs=batch.max_num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=host["frequency_penalties"], presence_penalties=host["presence_penalties"],
        repetition_penalties=host["repetition_penalties"], output_token_ids=[], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=batch.logitsprocs, spec_token_ids=batch.spec_token_ids,
        thinking_budget_state_holder=batch.thinking_budget_state_holder)


# ---- the compiled sampler -------------------------------------------------------------------------


def _exponential_noise_jax(seeds, offsets, salts, *, vocab: int):
    """One row of Exp(1) noise per request, from its own key: (seed, offset) of its
    generator (salt 0), or of the step's draw of the global stream (salt = row + 1)."""
    import jax

    def row(seed, offset, salt):
        key = jax.random.fold_in(rng.key(seed, offset), salt)
        return jax.random.exponential(key, (vocab,), jax.numpy.float32)

    return jax.vmap(row)(seeds, offsets, salts)


@functools.lru_cache(maxsize=None)
def exponential_noise_op(vocab: int):
    """The noise as a tpu op (made before tracing: an op cannot be defined inside a compiled region)."""
    fn = functools.partial(_exponential_noise_jax, vocab=vocab)
    return torch.tpu.pallas.jax_op(f"vllm_sampling_noise_{vocab}", fn)


def keep_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Each row's logits sorted ascending, those outside its top-k and top-p set to -inf,
    and the sort order. ``k = vocab`` and ``p = 1`` keep every token (vLLM's rule)."""
    vocab = logits.shape[-1]
    ascending, order = logits.sort(dim=-1)
    kth = ascending.gather(-1, (vocab - top_k.clamp(1, vocab)).unsqueeze(-1))
    ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    last = torch.arange(vocab, device=logits.device) == vocab - 1  # the best token always stays
    drop = (cumulative <= 1 - top_p.unsqueeze(-1)) & ~last
    return ascending.masked_fill(drop, float("-inf")), order


def sample_rows(logits, temperature, top_k, top_p, seeds, offsets, salts, *, kind: SamplingKind, noise):
    """The sampled token of every row (and its logprobs), as vLLM's sampler computes them.

    Random rows take ``argmax(probs / q)`` with ``q ~ Exp(1)``, which draws
    from ``probs`` (vLLM's method); greedy rows (temperature < eps) take the
    argmax of the raw logits."""
    check_same_rows("the sampler's inputs", logits, temperature, top_k, top_p, seeds, offsets, salts)
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    tokens = greedy
    if kind.random:
        scaled = logits / torch.where(temperature < SAMPLING_EPS, 1.0, temperature).unsqueeze(-1)
        q = noise(seeds, offsets, salts)
        if kind.top_k_top_p:
            kept, order = keep_top_k_top_p(scaled, top_k, top_p)
            picked = (kept.softmax(dim=-1) / q).argmax(dim=-1, keepdim=True)
            drawn = order.gather(-1, picked).squeeze(-1)
        else:
            drawn = (scaled.softmax(dim=-1) / q).argmax(dim=-1)
        tokens = torch.where(temperature < SAMPLING_EPS, greedy, drawn)
    # vLLM's layouts: token ids [rows, 1] int32; logprob ids [rows, 1 + k] int32
    sampled = tokens.to(torch.int32).unsqueeze(-1)
    if kind.logprobs is None:
        return (sampled,)
    logprobs = logits.log_softmax(dim=-1)
    token_logprobs = logprobs.gather(-1, tokens.unsqueeze(-1))
    ranks = (logprobs >= token_logprobs).sum(dim=-1)
    top_logprobs, top_ids = logprobs.topk(kind.logprobs, dim=-1)
    return (sampled, torch.cat((sampled, top_ids.to(torch.int32)), dim=1),
            torch.cat((token_logprobs, top_logprobs), dim=1), ranks)


class TpuSampler(torch.nn.Module):
    """The runner's ``sampler``: the compiled sampler where it applies, vLLM's otherwise.

    ``logits`` arrive padded to the step's request bucket (the runner's LM head
    computes those rows); row ``i < num_reqs`` is request ``i``."""

    def __init__(self, runner, vllm_sampler, compiled: bool):
        super().__init__()
        self.runner = runner
        self.vllm_sampler = vllm_sampler
        self.logprobs_mode = vllm_sampler.logprobs_mode
        self.compiled = compiled
        self._programs = {}
        self.last_tokens: torch.Tensor | None = None
        self._fallback_logged = set()

    def forward(self, logits, sampling_metadata, predict_bonus_token: bool = False,
                logprobs_mode_override=None):
        batch = self.runner.input_batch
        n = batch.num_reqs
        fast = (isinstance(sampling_metadata, HostSamplingMetadata) and sampling_metadata is batch.sampling_metadata
                and logprobs_mode_override in (None, self.logprobs_mode) and logits.shape[0] >= n)
        if not fast:
            return self._vllm_sample(logits[:n] if logits.shape[0] != n else logits, sampling_metadata,
                                     predict_bonus_token, logprobs_mode_override)
        kind = self.kind_of(batch, logits.shape[-1])
        inputs = self.host_inputs(batch, logits.shape[0], kind)
        outs = self.program(logits.shape[-1], kind)(logits, *tensor.from_host_all(inputs))
        self.last_tokens = outs[0]  # every row's token, [request bucket, 1]: the next step's input ids
        # Under async scheduling vLLM copies the outputs to the host without blocking; else it reads them now.
        return self.sampler_output(outs if self.runner.use_async_scheduling else [t.cpu() for t in outs], n,
                                   batch.max_num_logprobs)

    def _vllm_sample(self, logits, metadata, predict_bonus_token, logprobs_mode_override):
        if isinstance(metadata, HostSamplingMetadata):  # a dummy run with the batch's host metadata
            metadata = self.runner.input_batch.original_sampling_metadata()
        return self.vllm_sampler(logits, metadata, predict_bonus_token, logprobs_mode_override)

    def max_logprobs(self, vocab: int) -> int:
        limit = self.runner.model_config.max_logprobs
        return vocab if limit < 0 else min(limit, vocab)

    def kind_of(self, batch, vocab: int) -> SamplingKind:
        random = not batch.all_greedy
        return SamplingKind(random=random, top_k_top_p=random and not (batch.no_top_k and batch.no_top_p),
                            logprobs=None if batch.max_num_logprobs is None else self.max_logprobs(vocab))

    def kinds(self, vocab: int) -> list[SamplingKind]:
        """Every kind a step can take, for the warm-up."""
        return [SamplingKind(random, top and random, logprobs)
                for random in (False, True) for top in (False, True) if random or not top
                for logprobs in (None, self.max_logprobs(vocab))]

    def program(self, vocab: int, kind: SamplingKind):
        """The sampler of one kind: compiled (one program per request bucket), or eager."""
        if kind not in self._programs:
            fn = functools.partial(sample_rows, kind=kind, noise=exponential_noise_op(vocab))
            self._programs[kind] = compile_per_bucket(fn) if self.compiled else fn
        return self._programs[kind]

    def host_inputs(self, batch, rows: int, kind: SamplingKind) -> list[torch.Tensor]:
        """Temperature, top-k, top-p and each row's noise key, padded to ``rows``:
        a padding row is a greedy one that keeps every token."""
        n = batch.num_reqs
        temperature = np.zeros(rows, np.float32)
        top_k = np.full(rows, batch.vocab_size, np.int64)
        top_p = np.ones(rows, np.float32)
        temperature[:n], top_k[:n], top_p[:n] = batch.temperature_cpu[:n], batch.top_k_cpu[:n], batch.top_p_cpu[:n]
        seeds, offsets, salts = (np.zeros(rows, np.int64) for _ in range(3))
        if kind.random:
            seeds[:], offsets[:] = rng.next_seed_and_offset()
            salts[:] = np.arange(1, rows + 1)
            for i, generator in batch.generators.items():
                # Four counts a draw: vLLM rewinds a discarded request's generator by four.
                seeds[i], offsets[i], salts[i] = generator.initial_seed() % (1 << 32), generator.get_offset(), 0
                generator.set_offset(int(offsets[i]) + 4)
        return [torch.from_numpy(a) for a in (temperature, top_k, top_p, seeds, offsets, salts)]

    @staticmethod
    def sampler_output(outs, n: int, num_logprobs: int | None) -> SamplerOutput:
        """vLLM's ``SamplerOutput``: views of the first ``n`` rows of the sampler's outputs."""
        logprobs = None
        if num_logprobs is not None:
            ids, values, ranks = outs[1:]
            logprobs = LogprobsTensors(ids[:n, :num_logprobs + 1], values[:n, :num_logprobs + 1], ranks[:n])
        return SamplerOutput(sampled_token_ids=outs[0][:n], logprobs_tensors=logprobs)

    def warm_up(self, logits: torch.Tensor) -> None:
        """Compile every kind for the request bucket of ``logits``."""
        rows, vocab = logits.shape

        class Idle:  # a batch of `rows` greedy requests that keep every token
            num_reqs, vocab_size, generators = rows, vocab, {}
            temperature_cpu = np.ones(rows, np.float32)
            top_k_cpu = np.full(rows, vocab, np.int64)
            top_p_cpu = np.ones(rows, np.float32)

        for kind in self.kinds(vocab):
            self.program(vocab, kind)(logits, *tensor.from_host_all(self.host_inputs(Idle, rows, kind)))


def install_host_sampling_metadata(batch, logprobs_mode: str) -> None:
    """Make the input batch build :class:`HostSamplingMetadata` where the compiled sampler applies."""
    original = batch._make_sampling_metadata
    batch.original_sampling_metadata = original
    batch._make_sampling_metadata = functools.partial(make_sampling_metadata, batch, original, logprobs_mode)

