"""vLLM's V1 GPU model runner on tpu: per-layer KV cache tensors, a compiled step per token bucket."""

from __future__ import annotations

import contextlib
import copy
import functools
import time

import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, UniformTypeKVCacheSpecs
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import SlotMappingMode
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from torchtpu.core import tensor

from ..paged_attention import kv_storage_dtype, token_bucket
from .attention import kv_cache_shape
from .compiled import check_same_rows, compile_per_bucket
from .sampler import TpuSampler, install_host_sampling_metadata, request_bucket, request_buckets
from .weights import store_linear_weights_in_out

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger, which prints INFO

# What ``_prepare_inputs`` returns as the step's logits indices: vLLM's
# ``hidden_states[logits_indices]`` is then the whole of them (a view, no
# program), and the LM head gathers the sample rows itself (``_logits_of_rows``).
ALL_ROWS = slice(None)


@contextlib.contextmanager
def cuda_api_on_tpu():
    """Point the ``torch.cuda`` stream and event names the runner's constructor uses at ``torch.tpu``."""
    names = ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream")
    saved = {name: getattr(torch.cuda, name) for name in names}
    try:
        for name in names:
            setattr(torch.cuda, name, getattr(torch.tpu, name))
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


class Uploads:
    """Host-to-device copies of a step, made in one transfer call just before the model runs.

    On tpu each upload is a transfer call of its own (~0.2 ms of host time on
    XLA:CPU), and a step prepares a dozen small buffers. ``copy`` takes a
    snapshot of the host tensor at once, so the values are those of the call."""

    def __init__(self):
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def copy(self, device: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        if device.shape != host.shape:
            raise RuntimeError(f"torchtpu: an upload of shape {tuple(host.shape)} into {tuple(device.shape)}")
        self.pending[id(device)] = (device, host.to(device.dtype, copy=True))
        return device

    def flush(self) -> None:
        if not self.pending:
            return
        devices, hosts = zip(*self.pending.values())
        self.pending.clear()
        for device, uploaded in zip(devices, tensor.from_host_all(hosts)):
            tensor.write(device, tensor.read(uploaded))


def copy_whole_buffer(uploads: Uploads, buffer: CpuGpuBuffer, n: int | None = None) -> torch.Tensor:
    """``CpuGpuBuffer.copy_to_gpu`` for tpu: upload the whole host buffer, not its first ``n`` rows.

    Writing a prefix of a device buffer is a program per ``n``; replacing the
    buffer is a plain transfer of a fixed size. The rows past ``n`` are unused
    by the step, whichever values they hold."""
    uploads.copy(buffer.gpu, buffer.cpu)
    return buffer.gpu if n is None else buffer.gpu[:n]


def take_sampled_ids(input_ids: torch.Tensor, sampled: torch.Tensor, source: torch.Tensor) -> None:
    """``input_ids[i] = sampled[source[i]]`` wherever ``source[i] >= 0``, in place."""
    check_same_rows("the sampled ids' destinations", input_ids, source)
    taken = sampled.reshape(-1).index_select(0, source.clamp(min=0)).to(input_ids.dtype)
    input_ids.copy_(torch.where(source >= 0, taken, input_ids))


class TpuModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        with cuda_api_on_tpu():
            super().__init__(vllm_config, device)
        self._check_host_preparation_applies()
        self._host_positions = np.zeros(self.positions.shape, np.int64)
        self._host_padding = np.zeros(self.is_padding.shape, np.bool_)
        self._pending_sample_rows: torch.Tensor | None = None
        self._uploads = Uploads()
        # Async scheduling: where each input token's id comes from the previous step's sampled tokens (-1: the host's).
        self._host_sampled_source = np.full(self.input_ids.gpu.shape, -1, np.int64)
        self._sampled_source = torch.full(self.input_ids.gpu.shape, -1, dtype=torch.int64, device=self.device)
        self._pending_sampled_tokens: torch.Tensor | None = None
        self._take_sampled_ids = (take_sampled_ids if self.model_config.enforce_eager
                                  else compile_per_bucket(take_sampled_ids))
        self.sampler = TpuSampler(self, self.sampler, compiled=not self.model_config.enforce_eager)
        self._install_host_paths()

    def _install_host_paths(self) -> None:
        """Step inputs prepared on the host and uploaded whole: on tpu each small
        device op is a program launch, and each new slice length a new program."""
        for buffer in self._host_device_buffers():
            buffer.copy_to_gpu = functools.partial(copy_whole_buffer, self._uploads, buffer)
        for block_table in self.input_batch.block_table.block_tables:
            block_table.compute_slot_mapping = functools.partial(self._host_slot_mapping, block_table)
        for gid, groups in enumerate(getattr(self, "attn_groups", [])):
            host_table = self.input_batch.block_table[gid].block_table.np
            for group in groups:
                for builder in group.metadata_builders:
                    builder.host_block_table = host_table
        if not hasattr(self.input_batch, "original_sampling_metadata"):
            install_host_sampling_metadata(self.input_batch, self.sampler.logprobs_mode)

    def _host_slot_mapping(self, block_table, num_reqs, query_start_loc, positions) -> None:
        """``BlockTable.compute_slot_mapping`` from the runner's host arrays, then one upload.

        ``_prepare_inputs`` has filled ``req_indices`` and ``query_pos`` on the
        host before it asks; padding slots are -1, as vLLM's kernel writes them."""
        if block_table.slot_mapping_mode == SlotMappingMode.NONE:
            return
        num_tokens = positions.shape[0]
        request = self.req_indices.np[:num_tokens]
        position = self.input_batch.num_computed_tokens_cpu[request] + self.query_pos.np[:num_tokens]
        size = block_table.block_size
        slots = block_table.slot_mapping.np
        slots[:num_tokens] = block_table.block_table.np[request, position // size] * size + position % size
        slots[num_tokens:] = -1
        copy_whole_buffer(self._uploads, block_table.slot_mapping)

    def _check_host_preparation_applies(self) -> None:
        """The features whose inputs :meth:`_prepare_inputs` does not prepare (vLLM's own version does)."""
        unsupported = {
            "speculative decoding": self.speculative_config is not None,
            "multimodal rotary positions (M-RoPE/XD-RoPE)": self.uses_mrope or getattr(self, "uses_xdrope_dim", 0),
            "prompt embeddings": self.enable_prompt_embeds,
            "LoRA": self.lora_config is not None,
            "context parallelism": self.dcp_world_size > 1 or getattr(self, "pcp_world_size", 1) > 1,
            "KV sharing fast prefill": self.cache_config.kv_sharing_fast_prefill,
        }
        named = [name for name, used in unsupported.items() if used]
        if named:
            raise NotImplementedError(f"torchtpu's vLLM runner does not support {', '.join(named)} yet")

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens: np.ndarray):
        """vLLM's ``_prepare_inputs`` with every array computed on the host and uploaded whole.

        The same results as the GPU runner's for what this runner supports
        (:meth:`_check_host_preparation_applies`), without its small device
        ops: on tpu each is a program launch, and each new request or token
        count a new program. Returns ``(ALL_ROWS, None, 1)``: the sample rows,
        padded to the request bucket, wait for the LM head in
        ``_pending_sample_rows``."""
        batch = self.input_batch
        num_reqs = batch.num_reqs
        total = scheduler_output.total_num_scheduled_tokens
        batch.block_table.commit_block_table(num_reqs)

        req_indices = np.repeat(self.arange_np[:num_reqs], num_scheduled_tokens)
        cu_num_tokens = self._get_cumsum_and_arange(num_scheduled_tokens, self.query_pos.np)
        positions = batch.num_computed_tokens_cpu[req_indices] + self.query_pos.np[:total]
        token_indices = torch.from_numpy(positions + req_indices * batch.token_ids_cpu.shape[1])
        torch.index_select(batch.token_ids_cpu_tensor.flatten(), 0, token_indices, out=self.input_ids.cpu[:total])

        self.query_start_loc.np[0] = 0
        self.query_start_loc.np[1:num_reqs + 1] = cu_num_tokens
        self.query_start_loc.np[num_reqs + 1:].fill(cu_num_tokens[-1])
        self.query_start_loc.copy_to_gpu()

        seq_lens = self.optimistic_seq_lens_cpu
        seq_lens[:num_reqs] = batch.num_computed_tokens_cpu_tensor[:num_reqs] + torch.from_numpy(num_scheduled_tokens)
        seq_lens[num_reqs:] = 0
        self._compute_prev_positions(num_reqs)
        num_tokens = np.array([self.requests[r].num_tokens for r in batch.req_ids], dtype=np.int32)
        self.discard_request_mask.np[:num_reqs] = seq_lens[:num_reqs].numpy() < num_tokens
        self.discard_request_mask.copy_to_gpu(num_reqs)
        self.num_accepted_tokens.np.fill(1)
        self.num_accepted_tokens.copy_to_gpu()

        self.req_indices.np[:total] = req_indices
        self.req_indices.copy_to_gpu(total)
        self.query_pos.copy_to_gpu(total)
        self.num_scheduled_tokens.np[:num_reqs] = num_scheduled_tokens
        self.num_scheduled_tokens.copy_to_gpu(num_reqs)
        self._host_positions[:total] = positions
        self._host_positions[total:] = 0  # the padding tokens' positions (vLLM zeroes them on the device)
        self._uploads.copy(self.positions, torch.from_numpy(self._host_positions))
        self._uploads.copy(self.seq_lens, seq_lens)
        self._uploads.copy(self.num_computed_tokens,
                           batch.num_computed_tokens_cpu_tensor[:self.num_computed_tokens.shape[0]])
        batch.block_table.compute_slot_mapping(num_reqs, self.query_start_loc.gpu[:num_reqs + 1],
                                               self.positions[:total])
        self._prepare_input_ids(scheduler_output, num_reqs, total, cu_num_tokens)
        # The last token of each request samples; padding rows repeat the last one.
        rows = np.full(request_bucket(num_reqs, self.max_num_reqs), cu_num_tokens[-1] - 1, np.int64)
        rows[:num_reqs] = cu_num_tokens - 1
        self._pending_sample_rows = torch.from_numpy(rows).to(self.device)  # an upload, no program
        return ALL_ROWS, None, 1

    def _prepare_input_ids(self, scheduler_output, num_reqs: int, total_num_scheduled_tokens: int,
                           cu_num_tokens: np.ndarray) -> None:
        """The step's input ids: the host's, uploaded whole; under async scheduling the last step's
        sampled tokens, which the host does not know yet, are taken from the sampler's output on the
        device (one program per request bucket, where vLLM scatters a program per count)."""
        self.input_ids.copy_to_gpu(total_num_scheduled_tokens)
        sampled = self.input_batch.prev_sampled_token_ids
        if sampled is None:
            return
        previous = self.prev_positions.np[:num_reqs]
        continuing = previous >= 0
        source = self._host_sampled_source
        source.fill(-1)
        source[cu_num_tokens[continuing] - 1] = previous[continuing]  # a continuing request's one new token
        self._uploads.copy(self._sampled_source, torch.from_numpy(source))
        last = self.sampler.last_tokens  # all rows of the request bucket, when the compiled sampler ran
        same = last is not None and last.untyped_storage()._cdata == sampled.untyped_storage()._cdata
        self._pending_sampled_tokens = last if same else sampled

    def _model_forward(self, *args, **kwargs):
        self._uploads.flush()  # the step's inputs, in one transfer
        if self._pending_sampled_tokens is not None:
            sampled, self._pending_sampled_tokens = self._pending_sampled_tokens, None
            self._take_sampled_ids(self.input_ids.gpu, sampled, self._sampled_source)
        return super()._model_forward(*args, **kwargs)

    def sample_tokens(self, grammar_output):
        # Under async scheduling vLLM's output wrapper makes CUDA events and streams here.
        with cuda_api_on_tpu():
            return super().sample_tokens(grammar_output)

    def _preprocess(self, scheduler_output, num_input_tokens, intermediate_tensors=None):
        if self.supports_mm_inputs or self.model_config.is_encoder_decoder:
            return super()._preprocess(scheduler_output, num_input_tokens, intermediate_tensors)
        # The padding tokens' positions are zero already (host): counting them as
        # scheduled skips vLLM's zero_ of a slice, a program per token count.
        all_scheduled = copy.copy(scheduler_output)
        all_scheduled.total_num_scheduled_tokens = num_input_tokens
        return super()._preprocess(all_scheduled, num_input_tokens, intermediate_tensors)

    def _prepare_padding_mask(self, num_tokens_unpadded: int, num_tokens_padded: int) -> torch.Tensor:
        self._host_padding[:num_tokens_unpadded] = False
        self._host_padding[num_tokens_unpadded:] = True
        self._uploads.copy(self.is_padding, torch.from_numpy(self._host_padding))
        return self.is_padding[:num_tokens_padded]

    def _host_device_buffers(self):
        """The runner's paired host/device buffers (inputs, positions, block tables, ...)."""
        owners = [self, self.input_batch, *self.input_batch.block_table.block_tables]
        for owner in owners:
            for value in vars(owner).values():
                if isinstance(value, CpuGpuBuffer):
                    yield value

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        restored = store_linear_weights_in_out(self.model)
        if restored:
            logger.info("torchtpu: %d linear weights stored [in, out] (XLA:CPU's fast bfloat16 layout)", restored)
        if not self.model_config.enforce_eager:
            # The CUDA-graph equivalent: one trace, one XLA program per token bucket,
            # compiled at warm-up, then replayed.
            # Only forward is wrapped: vLLM reads the model's class to learn its tasks.
            self.model.forward = compile_per_bucket(self.model.forward)
        self._install_logits_of_rows()

    def _install_logits_of_rows(self) -> None:
        """The model's ``compute_logits``, gathering the step's sample rows first when
        ``_prepare_inputs`` left them: one program per (token bucket, request bucket)."""
        compute_logits = self.model.compute_logits

        def logits_of_rows(hidden_states, rows):
            return compute_logits(hidden_states.index_select(0, rows))

        if not self.model_config.enforce_eager:
            logits_of_rows = compile_per_bucket(logits_of_rows)
        self._logits_of_rows = logits_of_rows

        def compute_step_logits(hidden_states):
            rows, self._pending_sample_rows = self._pending_sample_rows, None
            return compute_logits(hidden_states) if rows is None else logits_of_rows(hidden_states, rows)

        self.model.compute_logits = compute_step_logits

    def _sync_device(self) -> None:
        torch.tpu.synchronize()

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()

    def token_buckets(self) -> list[int]:
        """Every padded token count a step can take: powers of two up to the batch budget."""
        limit = self.scheduler_config.max_num_batched_tokens
        return sorted({token_bucket(n, limit) for n in range(1, limit + 1)})

    def _get_slot_mappings(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices=None):
        """Each group's slot mapping, padded to the step's token bucket.

        The forward context's slot mappings reach the compiled step, so they
        take the bucket's length (or each token count is a new program); the
        host computation already wrote -1 past the step's tokens, so no fill."""
        if ubatch_slices is not None:
            raise NotImplementedError("torchtpu: micro-batching (ubatch slices) is not supported on tpu")
        groups = getattr(getattr(self, "kv_cache_config", None), "kv_cache_groups", None)
        if not groups:
            return None, None
        padded = token_bucket(num_tokens_unpadded, self.scheduler_config.max_num_batched_tokens)
        by_group = {gid: self.input_batch.block_table[gid].slot_mapping.gpu[:padded] for gid in range(len(groups))}
        for slots in by_group.values():  # sized by the token bucket, like the forward's inputs (compile_per_bucket)
            torch._dynamo.mark_dynamic(slots, 0)
        by_layer = {name: by_group[gid] for gid, group in enumerate(groups) for name in group.layer_names}
        return by_group, by_layer

    def _determine_batch_execution_and_padding(self, num_tokens, *args, **kwargs):
        # Pad every step to its token bucket, so each bucket's programs compile once.
        mode, descriptor, ubatch, across_dp, stats = super()._determine_batch_execution_and_padding(
            num_tokens, *args, **kwargs)
        padded = token_bucket(num_tokens, self.scheduler_config.max_num_batched_tokens)
        return CUDAGraphMode.NONE, BatchDescriptor(num_tokens=padded), ubatch, across_dp, stats

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        """One native-dtype tensor per layer, in the paged-attention kernel's layout."""
        self._install_host_paths()  # the input batch and the metadata builders are final now
        kv_caches: dict[str, torch.Tensor] = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            num_blocks = kv_cache_config.num_blocks_of(tensor)
            for layer_name in tensor.layers:
                spec = self._layer_spec(kv_cache_config, layer_name)
                kv_caches[layer_name] = torch.zeros(kv_cache_shape(num_blocks, spec),
                                                    dtype=kv_storage_dtype(spec.dtype), device=self.device)
        for layer_name, target_layer_name in self.shared_kv_cache_layers.items():
            kv_caches[layer_name] = kv_caches[target_layer_name]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches,
                      kv_cache_groups=kv_cache_config.kv_cache_groups)
        return kv_caches

    @staticmethod
    def _layer_spec(kv_cache_config, layer_name: str) -> AttentionSpec:
        group = next(g for g in kv_cache_config.kv_cache_groups if layer_name in g.layer_names)
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = spec.kv_cache_specs[layer_name]
        if not isinstance(spec, AttentionSpec):
            raise NotImplementedError(f"torchtpu: KV cache of kind {type(spec).__name__} (layer {layer_name}) "
                                      "is not supported on tpu yet")
        return spec

    @torch.inference_mode()  # as serving runs: Dynamo's guards include the grad mode
    def warm_up_buckets(self) -> None:
        """Run every token bucket, the LM head of every (token, request) bucket pair and
        every sampler kind of every request bucket once, so serving compiles nothing new."""
        buckets = self.token_buckets()
        start = time.perf_counter()
        logits_by_rows = {}
        for i, n in enumerate(buckets, 1):
            hidden_states, _ = self._dummy_run(n, force_attention=True)
            for rows in request_buckets(self.max_num_reqs):
                if rows <= n:
                    logits_by_rows[rows] = self._logits_of_rows(
                        hidden_states, torch.zeros(rows, dtype=torch.int64).to(self.device))
            logger.info("torchtpu: warmed up token bucket %d (%d/%d, %.1f s)", n, i, len(buckets),
                        time.perf_counter() - start)
        for rows, logits in sorted(logits_by_rows.items()):
            self.sampler.warm_up(logits)
            if self.use_async_scheduling:  # no source: the ids stay as they are
                self._take_sampled_ids(self.input_ids.gpu, torch.zeros(rows, 1, dtype=torch.int32).to(self.device),
                                       self._sampled_source)
            logger.info("torchtpu: warmed up the sampler for %d requests (%.1f s)", rows,
                        time.perf_counter() - start)
        torch.tpu.synchronize()
        self.compiles_after_warm_up = dict(torch.tpu.compile_stats())

    def recompiles(self) -> dict[str, int]:
        """Programs compiled since warm-up, by op: serving should compile none."""
        now = torch.tpu.compile_stats()
        before = getattr(self, "compiles_after_warm_up", {})
        return {op: n - before.get(op, 0) for op, n in now.items() if n > before.get(op, 0)}
