"""`tpu:LOCAL_RANK`: each process of a torchrun job names its chip as CUDA programs do.

The chip index is fixed at import (torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE),
so each case runs in a fresh process with that environment.  The values are
checked against the same program on CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu  # noqa: F401
from torchtpu.runtime import native

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=300, env=environ, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_native_extension_is_built_and_owns_the_guard():
    """setup.py builds it; without it only tpu:0 exists (a failed build must not pass unnoticed here)."""
    assert native.module is not None, "torchtpu._native was not built: run ./scripts/setup.sh"
    assert native.module.guard_installed()


def test_rank_one_names_its_chip_tpu_1_everywhere():
    out = _run("""
        import torch, torchtpu
        assert torch.tpu.device_count() == 2 and torch.tpu.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        torch.tpu.set_device(1)                       # torchrun scripts do this: accepted
        dev = torch.device("tpu:1")
        x = torch.arange(12.).reshape(3, 4)
        made = [torch.ones(2, device=dev), torch.empty(3, device="tpu"), torch.zeros(2, 2, device=dev),
                torch.arange(4, device=dev), x.to(dev), x.to("tpu"), x.tpu(), torch.randn(3, device=dev)]
        assert all(t.device == dev for t in made), [t.device for t in made]
        t = x.to(dev)
        views = [t[1:], t.view(12), t.t(), t[:, 2], t.transpose(0, 1).contiguous()]
        assert all(v.device == dev for v in views)
        assert t.untyped_storage().device == dev
        cpu_ref = (x @ x.t()).sum(0)
        assert torch.equal((t @ t.t()).sum(0).cpu(), cpu_ref)
        w = torch.randn(4, 3)
        wt = w.to(dev).requires_grad_()
        w.requires_grad_()
        (x @ w).pow(2).sum().backward()
        (t @ wt).pow(2).sum().backward()
        assert wt.grad.device == dev and torch.allclose(wt.grad.cpu(), w.grad, rtol=1e-5, atol=1e-5)
        assert torch.tpu.current_device() == 1      # the autograd workers did not move it
        m = torch.nn.Linear(4, 2).to(dev)
        assert m.weight.device == dev and m(t).device == dev
        with torch.tpu.device(1):
            assert torch.ones(1, device="tpu").device == dev
        print("ok")
    """, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert out.strip() == "ok"


def test_other_processes_chips_and_bad_indices_raise_clearly():
    out = _run("""
        import torch, torchtpu
        def error(fn):
            try:
                fn()
            except Exception as e:
                return f"{type(e).__name__}: {e}"
            return "no error"
        print(error(lambda: torch.ones(2, device="tpu:0")))
        print(error(lambda: torch.ones(2).to("tpu:0")))
        print(error(lambda: torch.empty(2, device="tpu:5")))
        torch.ones(1, device="tpu:1")
        print(error(lambda: torch.tpu.set_device(0)))
    """, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    lines = out.strip().split("\n")
    assert lines[0].startswith("RuntimeError: tpu:0 is another process's chip: this process drives tpu:1"), out
    assert lines[1].startswith("RuntimeError: tpu:0 is another process's chip"), out
    assert lines[2].startswith("RuntimeError: tpu: invalid device index 5: this host has 2 tpu device(s)"), out
    assert lines[3].startswith("RuntimeError: torch.tpu.set_device(0): this process already has tensors on tpu:1")


def test_set_device_before_the_first_tensor_renames_the_chip():
    out = _run("""
        import torch, torchtpu
        torch.tpu.set_device(2)
        t = torch.arange(3.).to("tpu")
        print(t.device, torch.tpu.current_device(), (t * 2).cpu().tolist())
    """, LOCAL_WORLD_SIZE="4")
    assert out.strip() == "tpu:2 2 [0.0, 2.0, 4.0]"


def test_checkpoints_saved_by_another_rank_load_onto_this_chip(tmp_path):
    path = tmp_path / "rank1.pt"
    _run(f"""
        import torch, torchtpu
        torch.save({{"w": torch.arange(4.).to("tpu:1")}}, {str(path)!r})
    """, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    loaded = torch.load(path)
    assert loaded["w"].device == torch.device("tpu:0")
    assert torch.equal(loaded["w"].cpu(), torch.arange(4.))


def test_without_the_extension_only_tpu_0_exists_and_local_rank_is_accepted():
    out = _run("""
        import torch, torchtpu
        from torchtpu.runtime import native
        assert native.module is None
        torch.tpu.set_device(1)                       # LOCAL_RANK: this process's chip, named tpu:0
        t = torch.ones(2, device="tpu")
        try:
            torch.ones(2, device="tpu:1")
        except RuntimeError as e:
            print(t.device, e)
    """, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", TORCHTPU_NATIVE="0")
    assert out.strip().startswith("tpu:0 tpu:1 needs torchtpu's C++ extension"), out


def test_single_process_has_one_device():
    assert torch.tpu.device_count() == 1 and torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match="invalid device index 1"):
        torch.ones(1, device="tpu:1")
