"""``UntypedStorage.resize_`` on tpu storages, as FSDP2 frees and refills parameters; checked against CPU."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu  # noqa: F401


def _pair(n=12, dtype=torch.float32):
    cpu = torch.arange(n, dtype=dtype)
    return cpu, cpu.to("tpu")


def test_resize_to_zero_releases_the_device_memory_and_every_view_sees_it():
    cpu, x = _pair()
    view = x[4:8]
    before = torch.tpu.memory_allocated()
    x.untyped_storage().resize_(0)
    cpu.untyped_storage().resize_(0)
    assert x.untyped_storage().nbytes() == view.untyped_storage().nbytes() == cpu.untyped_storage().nbytes() == 0
    assert torch.tpu.memory_allocated() == before - 48


def test_refill_through_a_view_after_freeing_matches_cpu():
    """FSDP2's cycle: free the unsharded parameter, re-allocate it, copy the gathered values into views."""
    cpu, x = _pair()
    for t in (cpu, x):
        storage = t.untyped_storage()
        storage.resize_(0)
        storage.resize_(48)
        torch.split_with_sizes_copy(torch.arange(100., 112.).to(t.device), [4, 8], out=[t[:4], t[4:]])
    assert torch.equal(x.cpu(), cpu)
    assert x.untyped_storage().nbytes() == 48


def test_growing_keeps_the_bytes_and_shrinking_keeps_the_prefix():
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        cpu, x = _pair(8, dtype)
        item = cpu.element_size()
        for t in (cpu, x):
            t.untyped_storage().resize_(16 * item)
        assert torch.equal(x[:8].cpu(), cpu[:8])  # the grown tail is uninitialised on CPU
        for t in (cpu, x):
            t.untyped_storage().resize_(3 * item)
        short_cpu = torch.empty(0, dtype=dtype).set_(cpu.untyped_storage())
        short_tpu = torch.empty(0, dtype=dtype, device="tpu").set_(x.untyped_storage())
        assert torch.equal(short_tpu.cpu(), short_cpu)


def test_a_storage_resize_names_the_bad_size():
    _, x = _pair()
    with pytest.raises(RuntimeError, match="negative size"):
        x.untyped_storage().resize_(-1)


def test_fsdp2_trains_on_one_process_like_cpu():
    """fully_shard with world size 1: parameters freed after forward and refilled, as with more ranks."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model = copy.deepcopy(ref).to("tpu")
        for layer in (model[0], model[2], model):
            fully_shard(layer)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
        for _ in range(3):
            x = torch.randn(5, 8)
            loss = model(x.to("tpu")).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            ref_loss = ref(x).square().sum()
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-5)
        for p, rp in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.full_tensor().cpu(), rp.detach(), rtol=1e-5, atol=1e-6)
        # resharded after the step: the unsharded parameters' storages hold nothing
        group = model[0]._get_fsdp_state()._fsdp_param_group
        assert all(t.untyped_storage().nbytes() == 0 for p in group.fsdp_params for t in p.all_gather_outputs)
    finally:
        dist.destroy_process_group()


def test_without_the_extension_resize_fails_with_torchs_message():
    code = textwrap.dedent("""
        import torch, torchtpu
        try:
            torch.ones(3, device="tpu").untyped_storage().resize_(0)
        except Exception as e:
            print(type(e).__name__, str(e).splitlines()[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "TORCHTPU_NATIVE": "0"})
    assert "resizePrivateUse1Bytes" in out.stdout, out.stdout + out.stderr


def test_copying_to_tpu_leaves_the_host_tensor_resizable():
    """As with CUDA: .to("tpu") must not pin the host storage's size (numpy() would)."""
    for dtype in (torch.float32, torch.bfloat16):
        host = torch.arange(4, dtype=dtype)
        host.to("tpu")
        host.untyped_storage().resize_(64)
        assert host.untyped_storage().nbytes() == 64
