"""torch.save / torch.load / pickle / deepcopy of tpu tensors, checked against CPU."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from oracle import assert_same

import torchtpu  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shares_storage(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _views_of(base):
    return {"base": base, "rows": base[1:], "cols": base[:, ::2], "t": base.t(), "flat": base.view(-1)[3:9]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float64, torch.complex64, torch.uint8])
@pytest.mark.parametrize("map_location", [None, "tpu", "cpu", torch.device("tpu")])
def test_save_load_roundtrip_keeps_values_and_view_sharing(dtype, map_location):
    cpu = _views_of((torch.arange(24).reshape(4, 6) % 5).to(dtype))
    tpu = _views_of(cpu["base"].to("tpu"))
    loaded = torch.load(_saved(tpu), map_location=map_location)
    device = "cpu" if map_location == "cpu" else "tpu"
    for name, expected in cpu.items():
        got = loaded[name]
        assert got.device.type == device
        assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == (
            expected.shape, expected.stride(), expected.storage_offset(), expected.dtype)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
        assert _shares_storage(got, loaded["base"]), name
    if device == "tpu":  # sharing is real: a write through one view shows in the others
        loaded["rows"].fill_(1)
        cpu["rows"].fill_(1)
        for name, expected in cpu.items():
            assert_same(loaded[name], expected)


def test_cpu_file_loads_onto_tpu():
    cpu = _views_of(torch.randn(4, 6))
    loaded = torch.load(_saved(cpu), map_location="tpu")
    for name, expected in cpu.items():
        assert_same(loaded[name], expected, atol=0, rtol=0, check_stride=True)
    assert _shares_storage(loaded["t"], loaded["base"])


def test_map_location_dict_and_callable():
    x = torch.arange(6.0).to("tpu")
    to_cpu = torch.load(_saved(x), map_location={"tpu:0": "cpu"})
    assert to_cpu.device.type == "cpu"
    torch.testing.assert_close(to_cpu, torch.arange(6.0))
    via_fn = torch.load(_saved(x), map_location=lambda storage, loc: storage)
    assert via_fn.device.type == "cpu"


def test_requires_grad_and_parameters_survive():
    w = torch.nn.Parameter(torch.randn(3, 2).to("tpu"))
    loaded = torch.load(_saved({"w": w, "g": w.detach().requires_grad_()}), map_location="tpu")
    assert isinstance(loaded["w"], torch.nn.Parameter) and loaded["w"].requires_grad
    assert loaded["g"].requires_grad
    assert_same(loaded["w"].detach(), w.detach().cpu())


def _module():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    m[1].running_mean.fill_(0.25)
    return m


def test_module_state_dict_roundtrip_on_tpu():
    reference = _module()
    m = _module().to("tpu")
    state = torch.load(_saved(m.state_dict()), map_location="tpu")
    assert set(state) == set(reference.state_dict())
    for name, value in reference.state_dict().items():
        assert state[name].device.type == "tpu", name
        assert_same(state[name], value, atol=0, rtol=0)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)).to("tpu")
    fresh.load_state_dict(state)
    for name, value in reference.state_dict().items():
        assert_same(fresh.state_dict()[name], value, atol=0, rtol=0)


def test_tied_weights_stay_tied():
    emb = torch.randn(5, 3).to("tpu")
    state = {"embed.weight": emb, "head.weight": emb}
    loaded = torch.load(_saved(state), map_location="tpu")
    assert loaded["embed.weight"] is loaded["head.weight"] or _shares_storage(loaded["embed.weight"], loaded["head.weight"])


def test_saved_file_does_not_name_torchtpu():
    data = _saved({"x": torch.arange(4.0).to("tpu"), "v": torch.arange(4.0).to("tpu")[1:]}).getvalue()
    assert b"torchtpu" not in data


def test_state_dict_from_tpu_loads_in_a_cpu_only_process(tmp_path):
    reference = _module()
    path = tmp_path / "state.pt"
    torch.save(_module().to("tpu").state_dict(), path)
    torch.save(reference.state_dict(), tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        assert "torchtpu" not in sys.modules, "torchtpu was imported"
        state = torch.load({str(path)!r}, map_location="cpu")
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        assert state.keys() == expected.keys()
        for k in state:
            assert state[k].device.type == "cpu"
            torch.testing.assert_close(state[k], expected[k], rtol=0, atol=0)
        assert "torchtpu" not in sys.modules, "torchtpu was imported"
        print("ok")
    """)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH="")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=str(tmp_path),
                            timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_weights_only_load_is_the_default_and_works():
    loaded = torch.load(_saved({"x": torch.arange(3).to("tpu")}), map_location="tpu", weights_only=True)
    assert_same(loaded["x"], torch.arange(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool])
def test_pickle_roundtrip(dtype):
    base = (torch.arange(12).reshape(3, 4) % 3).to(dtype)
    t = base.to("tpu")
    views = pickle.loads(pickle.dumps([t, t[1:, ::2]]))
    assert_same(views[0], base, check_stride=True)
    assert_same(views[1], base[1:, ::2], check_stride=True)
    assert views[1].storage_offset() == base[1:, ::2].storage_offset()
    # Like CPU, pickle writes each tensor's storage separately (no sharing).
    cpu = pickle.loads(pickle.dumps([base, base[1:, ::2]]))
    assert _shares_storage(views[0], views[1]) == _shares_storage(cpu[0], cpu[1])


def test_deepcopy_is_a_copy_and_keeps_sharing():
    base = torch.arange(12.0).reshape(3, 4).to("tpu")
    pair = {"base": base, "view": base[1]}
    copied = copy.deepcopy(pair)
    assert _shares_storage(copied["base"], copied["view"])
    assert not _shares_storage(copied["base"], base)
    copied["view"].fill_(-1)  # the copy is independent of the original
    assert_same(base, torch.arange(12.0).reshape(3, 4))
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1] = -1
    assert_same(copied["base"], expected)


def test_deepcopy_of_module_on_tpu():
    m = _module().to("tpu")
    c = copy.deepcopy(m)
    for (name, a), (_, b) in zip(m.state_dict().items(), c.state_dict().items()):
        assert b.device.type == "tpu" and not _shares_storage(a, b), name
        assert_same(b, a.cpu())


def test_copy_copy_and_storage_clone():
    t = torch.arange(5).to("tpu")
    s = t.untyped_storage().clone()
    assert s.device.type == "tpu" and s.nbytes() == t.untyped_storage().nbytes()
    again = torch.empty(0, dtype=torch.int64, device="tpu").set_(s)
    assert_same(again, torch.arange(5))
    assert_same(copy.copy(t), torch.arange(5))


def test_storage_moves_between_devices():
    host = torch.arange(4, dtype=torch.int32).untyped_storage()
    for moved in (host.tpu(), host.to(device="tpu")):
        assert moved.device.type == "tpu"
        back = torch.empty(0, dtype=torch.int32, device="tpu").set_(moved)
        assert_same(back, torch.arange(4, dtype=torch.int32))
        torch.testing.assert_close(torch.empty(0, dtype=torch.int32).set_(moved.cpu()), torch.arange(4, dtype=torch.int32))
