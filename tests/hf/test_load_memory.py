"""Loading a sharded checkpoint onto tpu never holds a second full copy on the host.

The measurement is bench/hf_load_memory.py's: a ~160 MB float32 Llama saved as
several safetensors shards, loaded by ``from_pretrained(dir, device_map="tpu")``
in a fresh process whose peak anonymous memory is sampled.  Beyond the model's
own bytes on the device (host memory on XLA's CPU backend), the load may
allocate about a shard at a time, never the whole model again.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "hf_load_memory.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("hf_load_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_sharded_load_holds_no_second_host_copy(tmp_path, record_property):
    bench = load_bench()
    checkpoint = bench.write_checkpoint(tmp_path, "160m")
    assert checkpoint["shards"] >= 5 and checkpoint["largest_shard"] < checkpoint["total"] / 4
    row = bench.measure(tmp_path, "float32")
    assert row["model_bytes"] >= checkpoint["parameters"] * 4  # float32 parameters, and buffers
    assert row["device"] >= row["model_bytes"]  # the weights are on the device
    transient = bench.transient(row)
    for name, value in [*checkpoint.items(), *row.items()]:
        record_property(name, value)  # tests/hf/report.py quotes them in docs/hf_support.md
    record_property("transient", transient)
    # A full host copy of the model would put this at or above the checkpoint's size;
    # streaming shard by shard keeps it near one shard (see docs/benchmarks.md).
    assert transient < checkpoint["total"], (transient, checkpoint)
