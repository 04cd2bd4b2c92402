"""The ``tpu`` attention backend for SGLang: one paged-attention op per layer over SGLang's KV pool.

SGLang keeps a key and a value buffer per layer, ``[slots, kv_heads, head_dim]``,
and a request's tokens live at the slots its row of ``req_to_token`` lists:
pages of one token. The computation is the vLLM backend's
(``torchtpu.integrations.paged_attention``, layout ``"separate"``): each token
attends to the step's own keys of its request, up to its position, and to the
keys its request cached before the step (a prefix-cache hit, an earlier chunk
of a chunked prefill, or the whole context of a decode step), a chunk of 64
slots at a time. Prefill, decode and mixed batches are the same op.

Where JAX's TPU ragged paged-attention kernel runs (on a TPU, or off it when
``TORCHTPU_SGLANG_PALLAS_ATTENTION`` asks, interpreted), the platform gives
SGLang the pool of ``kv_pool.py`` (keys and values interleaved in one buffer
per layer, the kernel's layout) and each layer the kernel takes calls it with
the step's per-request arrays (``ragged_attention.request_arrays``, padded to
a power of two of requests); a layer it cannot take reads that buffer with the
chunked op and the log says why, once.

SGLang runs prefill (extend) batches op by op, and every op's program is
compiled for the batch's token count, which the radix cache makes different
at nearly every step. So an extend batch is padded to a token bucket
(:func:`extend_bucket`) before the model sees it: a few programs serve every
batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

from torchtpu import config
from torchtpu.api.bucketing import bucket_size
from torchtpu.core import dtypes, tensor

from .. import ragged_attention
from ..paged_attention import chunk_pages, chunked_attention_op
from .kv_pool import InterleavedKVPool

logger = logging.getLogger(__name__)

# The chunked op reads SGLang's pools a slot at a time (pages of one slot, whatever `--page-size` is).
PAGE_SIZE = 1
SLOTS_PER_CHUNK = chunk_pages(PAGE_SIZE)


@dataclass
class TpuForwardMetadata:
    token_request: torch.Tensor   # [T] int64: the request (row of block_tables) of each token
    token_position: torch.Tensor  # [T] int64: the token's position in its sequence
    token_cached: torch.Tensor    # [T] int64: positions its request cached before this step
    cached_chunks: torch.Tensor   # [] int64: chunks of SLOTS_PER_CHUNK slots the longest cached prefix spans
    block_tables: torch.Tensor | None  # [S, P] int32: the slots of each request, P a multiple of SLOTS_PER_CHUNK
    # The ragged paged-attention kernel's view of the step, requests padded to a power of two (R):
    page_indices: torch.Tensor | None = None  # [R, P'] the pages of each request
    kv_lens: torch.Tensor | None = None       # [R] int32: each request's sequence length, 0 for padding
    cu_q_lens: torch.Tensor | None = None     # [R + 1] int32: where each request's tokens start, then the count
    num_seqs: torch.Tensor | None = None      # [1] int32: the requests of the step


# The page size the kernel gets unless the user sets one (--page-size): each page is one DMA, and JAX's tuned
# table recommends at least 16 slots (SGLang's own default is 1).
KERNEL_PAGE_SIZE = 16


def kernel_wanted() -> bool:
    """SGLang's attention runs the ragged paged-attention kernel on a TPU, and elsewhere when a setting asks
    for it (in Pallas' TPU interpreter: slow, for testing)."""
    return ragged_attention.on_tpu() or config.current.sglang_pallas_attention


def kernel_metadata(cached_lens: np.ndarray, new_lens: np.ndarray) -> dict[str, np.ndarray]:
    """The kernel's per-request arrays of a step, requests padded to a power of two."""
    query_start = np.concatenate([[0], np.cumsum(new_lens)])
    return ragged_attention.request_arrays(query_start, cached_lens + new_lens, bucket_size(len(new_lens)))


def host_metadata(cached_lens: np.ndarray, new_lens: np.ndarray) -> dict[str, np.ndarray]:
    """A step's per-token arrays from each request's cached and new token counts (requests in batch order)."""
    token_request = np.repeat(np.arange(len(new_lens)), new_lens)
    starts = np.cumsum(new_lens) - new_lens
    offset = np.arange(int(new_lens.sum())) - np.repeat(starts, new_lens)
    token_cached = np.repeat(cached_lens, new_lens)
    longest_prefix = int(cached_lens.max(initial=0))
    return {
        "token_request": token_request.astype(np.int64),
        "token_position": (token_cached + offset).astype(np.int64),
        "token_cached": token_cached.astype(np.int64),
        "cached_chunks": np.array(-(-longest_prefix // SLOTS_PER_CHUNK), np.int64),
    }


def extend_bucket(tokens: int) -> int:
    """The padded token count of an extend batch: at least 16, then four sizes per power of two
    (a quarter of a power of two apart), so padding adds at most a quarter to the batch."""
    if tokens <= 16:
        return 16
    granule = 1 << max((tokens - 1).bit_length() - 3, 0)
    return -(-tokens // granule) * granule


def pads_to_bucket(forward_batch) -> bool:
    """Whether padding the batch's tokens at its end changes nothing the batch returns: a plain extend
    whose logits come from each request's last token (no input logprobs, no hidden states, no
    model-specific positions or embeddings)."""
    return (forward_batch.forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED)
            and not forward_batch.return_logprob
            and forward_batch.capture_hidden_mode in (None, CaptureHiddenMode.NULL)
            and forward_batch.mrope_positions is None and forward_batch.input_embeds is None
            and forward_batch.input_ids is not None)


def padded_step(forward_batch, arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """The step's token arrays and model inputs with padding tokens at the end, up to its bucket.

    A padding token is token 0 at position 0 for the model, written to slot 0 (SGLang's
    reserved padding slot), and at position -1 for attention, where no token sees it."""
    tokens = len(arrays["token_request"])
    extra = extend_bucket(tokens) - tokens

    def pad(values: np.ndarray, value: int) -> np.ndarray:
        return np.pad(values, (0, extra), constant_values=value)

    padded = {**arrays, "token_request": pad(arrays["token_request"], 0),
              "token_position": pad(arrays["token_position"], -1), "token_cached": pad(arrays["token_cached"], 0)}
    positions = pad(arrays["token_position"], 0).astype(dtypes.to_jax(forward_batch.positions.dtype))
    inputs = {"input_ids": pad(forward_batch.input_ids.cpu().numpy(), 0), "positions": positions,
              "out_cache_loc": pad(forward_batch.out_cache_loc.cpu().numpy(), 0)}
    return padded, inputs


def step_lengths(forward_batch) -> tuple[np.ndarray, np.ndarray]:
    """Each request's cached and new token counts in this step, from the batch's host copies."""
    if forward_batch.forward_mode.is_decode():
        seq_lens = forward_batch.seq_lens_cpu.numpy().astype(np.int64)
        return seq_lens - 1, np.ones_like(seq_lens)
    return (np.asarray(forward_batch.extend_prefix_lens_cpu, np.int64),
            np.asarray(forward_batch.extend_seq_lens_cpu, np.int64))


def padded_block_tables(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor) -> torch.Tensor:
    """The slot rows of the step's requests, padded to whole chunks (the op reads a chunk at a time)."""
    tables = req_to_token.index_select(0, req_pool_indices)
    pad = -tables.shape[1] % SLOTS_PER_CHUNK
    return torch.nn.functional.pad(tables, (0, pad)) if pad else tables


class TpuAttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.forward_metadata: TpuForwardMetadata | None = None
        self.interleaved = isinstance(self.token_to_kv_pool, InterleavedKVPool)
        # Each layer's op and whether it is the kernel, made here: defining an op while Dynamo traces the
        # forward fails.
        self.layer_ops = {layer.layer_id: layer_op(layer, self.token_to_kv_pool)
                          for layer in model_runner.model.modules() if isinstance(layer, RadixAttention)}
        self.kernel_layers = any(is_kernel for _, is_kernel in self.layer_ops.values())
        self.chunked_layers = not all(is_kernel for _, is_kernel in self.layer_ops.values())

    def _host_arrays(self, cached_lens: np.ndarray, new_lens: np.ndarray) -> dict[str, np.ndarray]:
        arrays = host_metadata(cached_lens, new_lens)
        if self.kernel_layers:
            arrays.update(kernel_metadata(cached_lens, new_lens))
        return arrays

    def init_forward_metadata(self, forward_batch) -> None:
        arrays = self._host_arrays(*step_lengths(forward_batch))
        if not pads_to_bucket(forward_batch):
            self._upload(arrays, forward_batch.req_pool_indices)
            return
        # The model reads its inputs from the batch after this call (SGLang's eager runner): the padded
        # ones replace them there.
        arrays, inputs = padded_step(forward_batch, arrays)
        for name, value in self._upload(arrays, forward_batch.req_pool_indices, inputs).items():
            setattr(forward_batch, name, value)
        # SGLang narrows attention to this many rows (its own padding's real ones); ours covers the padding too.
        forward_batch.global_num_token_non_padded_cpu = len(arrays["token_request"])

    def _upload(self, arrays: dict[str, np.ndarray], req_pool_indices: torch.Tensor,
                extra: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
        """Upload the metadata ``arrays`` (kept as ``forward_metadata``) and ``extra``, in one transfer;
        returns ``extra`` uploaded."""
        extra = extra or {}
        names = [*arrays, *extra]
        uploaded = dict(zip(names, tensor.from_host_all([torch.from_numpy(a) for a in [*arrays.values(),
                                                                                         *extra.values()]])))
        req_to_token = self.req_to_token_pool.req_to_token
        tables = padded_block_tables(req_to_token, req_pool_indices) if self.chunked_layers else None
        pages = None
        if self.kernel_layers:
            pages = kernel_page_indices(req_to_token, req_pool_indices, len(arrays["kv_lens"]),
                                        self.token_to_kv_pool.page_size)
        self.forward_metadata = TpuForwardMetadata(**{name: uploaded[name] for name in arrays}, block_tables=tables,
                                                   page_indices=pages)
        return {name: uploaded[name] for name in extra}

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def _attend(self, q, k, v, layer, forward_batch, save_kv_cache: bool):
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        query = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        key = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)
        value = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
        meta = self.forward_metadata
        op, is_kernel = self.layer_ops[layer.layer_id]
        pool = self.token_to_kv_pool
        if is_kernel:
            out = op(query, pool.get_kv_pages(layer.layer_id), meta.page_indices, meta.kv_lens, meta.cu_q_lens,
                     meta.num_seqs)
        else:
            caches = ((pool.get_kv_pages(layer.layer_id, page_size=PAGE_SIZE),) if self.interleaved
                      else (pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)))
            out = op(query, key, value, *caches, meta.block_tables, meta.token_request, meta.token_position,
                     meta.token_cached, meta.cached_chunks)
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    # The graph runner's hooks (SGLang's CPU graph runner, which the tpu runner extends).

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass  # the metadata is uploaded fresh each step: no persistent buffers to size

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        return 1  # a padding request: one token at position 0, in the reserved slot 0

    def init_forward_metadata_capture_cpu_graph(self, bs, num_tokens, req_pool_indices, seq_lens, out_cache_loc,
                                                encoder_lens, forward_mode, spec_info) -> None:
        if not forward_mode.is_decode():
            raise NotImplementedError(f"torchtpu: the tpu graph runner compiles decode steps, not {forward_mode}")
        lengths = seq_lens.cpu().numpy().astype(np.int64)
        self._upload(self._host_arrays(lengths - 1, np.ones_like(lengths)), req_pool_indices)

    def support_triton(self):
        return False


def kernel_page_indices(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, rows: int,
                        page_size: int) -> torch.Tensor:
    """The pages of the step's requests (their rows of ``req_to_token``, a slot per token, page-aligned),
    padded to ``rows`` requests."""
    pages = req_to_token.index_select(0, req_pool_indices)[:, ::page_size] // page_size
    return torch.nn.functional.pad(pages, (0, 0, 0, rows - pages.shape[0]))


def layer_op(layer, pool):
    """The attention op of one layer (its scale, window and soft cap are constants of it) and whether it is
    the ragged paged-attention kernel (over the interleaved pool, where the kernel takes the layer)."""
    check_supported(layer)
    window = layer.sliding_window_size if layer.sliding_window_size is not None and layer.sliding_window_size > -1 \
        else None
    interleaved = isinstance(pool, InterleavedKVPool)
    if interleaved:
        reason = ragged_attention.unsupported_reason(layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim,
                                                     pool.dtype)
        if reason is None:
            if ragged_attention.on_tpu():
                _log_once(logging.INFO, "torchtpu: SGLang attention runs JAX's ragged paged-attention Pallas kernel")
            else:
                _log_once(logging.WARNING, "torchtpu: SGLang attention runs JAX's ragged paged-attention Pallas "
                          "kernel in Pallas' TPU interpreter (slow: for testing)")
            return ragged_attention.ragged_attention_op(layer.scaling, window, layer.logit_cap or None), True
        _log_once(logging.WARNING, f"torchtpu: SGLang attention runs the chunked op, not the ragged paged-attention Pallas kernel: "
                  f"{reason}")
    layout = "interleaved" if interleaved else "separate"
    return chunked_attention_op(layer.scaling, window, layer.logit_cap or None, PAGE_SIZE, layout=layout), False


_logged: set[str] = set()


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.log(level, message)


def check_supported(layer) -> None:
    if layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY:
        raise NotImplementedError("torchtpu: SGLang's tpu attention runs causal decoder attention only")
    if layer.qk_head_dim != layer.v_head_dim:
        raise NotImplementedError("torchtpu: keys and values of different head sizes are not supported yet")
