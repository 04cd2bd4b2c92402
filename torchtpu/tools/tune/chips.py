"""The TPU generations the tuner predicts for, and the host it calibrates on.

Every figure is per chip and comes from Google Cloud's public TPU pages: each entry's ``source`` names the
page, and the comment above it says which table row gave which figure and what was assumed where the page is
silent.  Rates are in bytes or operations per second; capacities in bytes ("GiB" on a page is 2**30 bytes,
"GB" 10**9).  Checked against the pages on 2026-12-07.

Interconnect conventions (the planner's communication model relies on them):

- ``ici_bandwidth``: all of a chip's ICI links together, one direction.  Google's tables give the
  bidirectional figure, so this is half of it.  A ring over one torus dimension uses the two links of that
  dimension, ``ici_bandwidth / torus_dims`` one way.
- ``dcn_bandwidth``: the chip's share of its host's data-centre NICs, one direction.
- ``ici_latency`` / ``dcn_latency``: the fixed cost of one step of a ring algorithm.  The pages give no
  latencies; these are order-of-magnitude assumptions (a few microseconds per ICI hop, tens over DCN).
- ``call_latency``: a fixed cost per collective, whatever its size and group.  Negligible on a TPU (the
  collective is part of the step's program); on the host it is the dominant latency (c10d's Python entry,
  a program launch, gloo's rendezvous), so the host is calibrated with it and no per-step latency.  With
  more processes than ``host_cores`` that fixed CPU work queues: it grows by processes / cores.  (The
  transfer itself is not stretched: measured 4-process over 2-process times at 16-64 MB ranged 1.0-2.7
  across runs, around the ring's 1.5, not the 3.0 that sharing two cores among four would give.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace


# bfloat16 passes the MXU makes for one float32 product at each matmul precision (torch.tpu.precision).
MXU_PASSES = {"default": 1, "high": 3, "highest": 6}


@dataclass(frozen=True)
class Chip:
    name: str
    bf16_flops: float  # peak dense bf16 FLOP/s
    int8_ops: float  # peak int8 OP/s (fp8 FLOP/s where the chip has fp8 instead)
    fp8_flops: float  # peak fp8 FLOP/s (0 where the page lists none)
    hbm_bytes: float  # HBM capacity
    hbm_bandwidth: float  # HBM bytes/s
    ici_bandwidth: float  # inter-chip interconnect bytes/s per chip, all links, one direction
    ici_topology: str  # "2d-torus", "3d-torus", or "switch" (every pair directly connected: the host)
    dcn_bandwidth: float  # data-centre network bytes/s per chip (between slices), one direction
    max_slice_chips: int  # the largest slice joined by ICI
    mxu_tile: int  # the matrix unit's edge: dimensions should be multiples of it
    source: str
    chips_per_host: int = 4  # chips one TPU VM drives (torchrun's --nproc_per_node)
    ici_latency: float = 2e-6  # seconds per ring step over ICI (assumed, see above)
    dcn_latency: float = 20e-6  # seconds per ring step over DCN (assumed, see above)
    call_latency: float = 0.0  # seconds per collective call (the host's dominant latency)
    host_cores: int = 0  # the host only: cores its processes share; more processes stretch call_latency

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which the chip is compute-bound."""
        return self.bf16_flops / self.hbm_bandwidth

    @property
    def torus_dims(self) -> int:
        return {"2d-torus": 2, "3d-torus": 3}.get(self.ici_topology, 1)


_GB = 1e9
_GIB = 2**30
_T = 1e12
_GBIT = 1e9 / 8  # one gigabit per second, in bytes per second

CHIPS: dict[str, Chip] = {
    # v4 page, "Key specifications": 275 TFLOPs (bf16 or int8), HBM2 32 GiB at 1200 GBps, pod 4096 chips,
    # 3D mesh (a torus when each dimension is a multiple of 4).  The page gives no ICI or DCN figure: ICI is
    # 6 links x 45 GB/s one way (the TPU v4 paper, ISCA 2023), DCN assumed equal to v5p's 50 Gbps per chip.
    "v4": Chip("v4", 275 * _T, 275 * _T, 0.0, 32 * _GIB, 1200 * _GB, 6 * 45 * _GB, "3d-torus",
               50 * _GBIT, 4096, 128, "https://cloud.google.com/tpu/docs/v4", chips_per_host=4),
    # v5e page, "Key chip specifications": 197 TFLOPs bf16, 393 TOPs int8, HBM2 16 GB at 819 GBps,
    # bidirectional ICI 400 GBps (1600 Gbps one way); pod 256 chips, 2D torus; DCN per pod 6.4 Tbps
    # = 25 Gbps per chip (2 x 100 Gbps NICs per 8-chip host, the v6e page's comparison table).
    "v5e": Chip("v5e", 197 * _T, 393 * _T, 0.0, 16 * _GB, 819 * _GB, 400 * _GB / 2, "2d-torus",
                25 * _GBIT, 256, 128, "https://cloud.google.com/tpu/docs/v5e", chips_per_host=8),
    # v5p page, "Specification / Values": 459 TFLOPs bf16 (fp8 row 459: no faster fp8), HBM 95 GiB at
    # 2765 GBps, bidirectional ICI 1200 GBps, DCN 50 Gbps per chip, 3D torus; the largest single slice is
    # 6144 chips (16x16x24) of an 8960-chip pod.  int8 918 TOPs: Google's v5p launch figures (2 x bf16).
    "v5p": Chip("v5p", 459 * _T, 918 * _T, 459 * _T, 95 * _GIB, 2765 * _GB, 1200 * _GB / 2, "3d-torus",
                50 * _GBIT, 6144, 128, "https://cloud.google.com/tpu/docs/v5p", chips_per_host=4),
    # v6e page: 918 TFLOPs bf16, 1836 TOPs int8, HBM 32 GB at 1640 GBps, bidirectional ICI 800 GBps per
    # chip, 2D torus, pod 256 chips, 4 x 200 Gbps NICs per 8-chip host = 100 Gbps per chip (also the tpu7x
    # page's DCN row); fp8 918 from the tpu7x page's comparison table.
    "v6e": Chip("v6e", 918 * _T, 1836 * _T, 918 * _T, 32 * _GB, 1640 * _GB, 800 * _GB / 2, "2d-torus",
                100 * _GBIT, 256, 256, "https://cloud.google.com/tpu/docs/v6e", chips_per_host=8),
    # tpu7x page, "System architecture": 2307 TFLOPs bf16, 4614 TFLOPs fp8, HBM 192 GiB at 7380 GBps,
    # bidirectional ICI 1200 GBps, DCN 100 Gbps per chip, 9216 chips per pod, 4 chips per VM.  The page
    # lists no int8 rate (fp8 given instead) and calls the generation v5p-like; its slices are AxBxC
    # topologies of 4x4x4 cubes (the tpu7x machine types in Google's xpk tool): a 3D torus.
    "v7x": Chip("v7x", 2307 * _T, 4614 * _T, 4614 * _T, 192 * _GIB, 7380 * _GB, 1200 * _GB / 2, "3d-torus",
                100 * _GBIT, 9216, 256, "https://cloud.google.com/tpu/docs/tpu7x", chips_per_host=4),
}

# The machine at hand, one process per "chip": its collectives go through the tpu c10d backend over JAX's
# gloo transport.  Link figures: all_reduce over 2 processes on this 2-core machine, fitted by bench/tune_comm.py on
# 2026-12-07 (0.3-0.9 GB/s and 0.5-6 ms across runs on the shared machine; docs/benchmarks.md has the
# latest); compute and memory figures are placeholders (the planner's host runs are about communication).
HOST = Chip("host", 1e11, 1e11, 0.0, 8 * _GIB, 10 * _GB, 0.81 * _GB, "switch", 0.81 * _GB, 64, 8,
            "measured: bench/tune_comm.py (docs/benchmarks.md)", chips_per_host=64, ici_latency=0.0,
            dcn_latency=0.0, call_latency=0.55e-3, host_cores=2)


def calibrated_host(latency: float, bandwidth: float, cores: int = 0, base: Chip = HOST) -> Chip:
    """The host pseudo-chip with a measured latency per call (s) and bandwidth per process (bytes/s)."""
    return replace(base, call_latency=latency, ici_latency=0.0, dcn_latency=0.0, ici_bandwidth=bandwidth,
                   dcn_bandwidth=bandwidth, host_cores=cores)


def chip(name: str) -> Chip:
    """The chip called ``name`` ("v5e", "v7x", "host", ...); a clear error for unknown names."""
    key = name.lower().removeprefix("tpu").removeprefix("-")
    key = {"7x": "v7x", "ironwood": "v7x", "trillium": "v6e", "v5litepod": "v5e"}.get(key, key)
    if key == "host":
        return HOST
    if key not in CHIPS:
        raise ValueError(f"unknown TPU generation {name!r}; known: {', '.join(CHIPS)}, host")
    return CHIPS[key]
