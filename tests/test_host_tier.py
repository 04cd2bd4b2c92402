"""Strict eager mode runs a small integer op's first calls of a new shape on the host (eager/host_tier.py).

CPU PyTorch is the oracle: each program below runs on CPU and on tpu, and the
tpu results, including every alias of a written storage, must equal CPU's,
whether a call ran on the host or as a compiled program.
"""

import pytest
import torch

import torchtpu
from torchtpu.core import tensor as tpu_tensor


def counts(op: str) -> tuple[int, int]:
    metrics = torch.tpu.metrics()
    return metrics["host_runs"][op], metrics["compiles"][op]


def bookkeeping(device, lengths):
    """A free list and a table of slots, as a serving engine keeps them: cats, slices, in-place writes."""
    free = torch.arange(100, 164, device=device)
    table = torch.zeros(4, 16, dtype=torch.int64, device=device)
    row = table[1]  # a view of the table's storage, read after the writes
    for i, n in enumerate(lengths):
        taken, free = free[:n], free[n:]
        table[i % 4, :n] = taken
        free = torch.cat([free, taken.flip(0)])
        table[i % 4, :n].add_(torch.cumsum(taken, 0) % 7)
    return free, table, row


@pytest.mark.parametrize("lengths", [[3, 5, 2, 7, 1], [4, 4, 4, 4, 4, 4]], ids=["new-shapes", "one-shape"])
def test_bookkeeping_equals_cpu_whichever_tier_runs_it(lengths):
    expected = bookkeeping("cpu", lengths)
    got = bookkeeping("tpu", lengths)
    for e, g in zip(expected, got):
        assert g.device.type == "tpu"
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


def test_a_shape_runs_on_the_host_twice_then_compiles_once():
    x = torch.arange(37, device="tpu", dtype=torch.int32)
    host, compiled = counts("aten.cumsum.default")
    results = [torch.cumsum(x, 0) for _ in range(5)]
    assert counts("aten.cumsum.default") == (host + 2, compiled + 1)
    for r in results:
        assert r.tolist() == torch.cumsum(torch.arange(37, dtype=torch.int32), 0).tolist()


def test_the_setting_turns_it_off():
    x = torch.arange(41, device="tpu")
    host, compiled = counts("aten.cumsum.default")
    with torchtpu.config.override(host_runs_before_compile=0):
        torch.cumsum(x, 0)
    assert counts("aten.cumsum.default") == (host, compiled + 1)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(43, device="tpu", dtype=torch.float32),    # floats: the two paths may round apart
    lambda: torch.arange(70_000, device="tpu", dtype=torch.int32),  # a storage over 64 KiB
], ids=["float", "large"])
def test_floats_and_large_tensors_compile_at_once(make):
    x = make()
    host, compiled = counts("aten.cumsum.default")
    torch.cumsum(x, 0)
    assert counts("aten.cumsum.default") == (host, compiled + 1)


def test_fused_mode_never_waits_for_values_on_the_host():
    x = torch.arange(47, device="tpu")
    host, _ = counts("aten.cumsum.default")
    with torch.tpu.eager_mode("DEFER_AND_FUSE"):
        y = torch.cumsum(x, 0)
    assert counts("aten.cumsum.default")[0] == host
    assert y.tolist() == torch.cumsum(torch.arange(47), 0).tolist()


def test_a_host_write_keeps_the_storage_layout_so_later_programs_keep_their_keys():
    table = torch.zeros(6, 10, dtype=torch.int32, device="tpu")
    table.add_(1)  # the storage's array is now [6, 10]
    layout = tpu_tensor.buffer_of(table).layout
    host, _ = counts("aten.copy_.default")
    table[2, 3:8] = torch.arange(5, dtype=torch.int32, device="tpu")
    assert counts("aten.copy_.default")[0] == host + 1
    assert tpu_tensor.buffer_of(table).layout == layout
    expected = torch.ones(6, 10, dtype=torch.int32)
    expected[2, 3:8] = torch.arange(5, dtype=torch.int32)
    assert torch.equal(table.cpu(), expected)


def test_a_host_run_raises_cpus_error_and_leaves_the_tensors_alone():
    table = torch.arange(12, device="tpu").reshape(3, 4)
    with pytest.raises(IndexError):
        table.index_put_((torch.tensor([5], device="tpu"),), torch.tensor(0, device="tpu"))
    assert table.tolist() == torch.arange(12).reshape(3, 4).tolist()


def test_an_op_cpu_has_no_kernel_for_compiles_instead():
    # CPU's histc has no integer kernel ("histogram_cpu" not implemented for 'Long'); the lowering has.
    values = torch.tensor([1, 2, 2, 4, 0, 3], device="tpu")
    counts_ = torch.histc(values, bins=5, min=0, max=5)
    assert counts_.dtype == torch.int64
    assert counts_.tolist() == torch.histc(values.cpu().float(), bins=5, min=0, max=5).long().tolist()
