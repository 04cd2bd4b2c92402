"""The TPU generations the tuner predicts for, and the host it calibrates on.

Every figure is per chip and comes from Google Cloud's public TPU pages (the
``source`` of each entry).  Rates are in bytes or operations per second.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    name: str
    bf16_flops: float  # peak dense bf16 FLOP/s
    int8_ops: float  # peak int8 OP/s (fp8 FLOP/s where the chip has fp8 instead)
    fp8_flops: float  # peak fp8 FLOP/s (0 where the chip has none)
    hbm_bytes: float  # HBM capacity
    hbm_bandwidth: float  # HBM bytes/s
    ici_bandwidth: float  # inter-chip interconnect bytes/s per chip, all links, one direction
    ici_topology: str  # "2d-torus" or "3d-torus"
    dcn_bandwidth: float  # data-centre network bytes/s per chip (between slices)
    max_slice_chips: int  # the largest slice joined by ICI
    mxu_tile: int  # the matrix unit's edge: dimensions should be multiples of it
    source: str

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which the chip is compute-bound."""
        return self.bf16_flops / self.hbm_bandwidth


_GB = 1e9
_GIB = 2**30
_T = 1e12

CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 275 * _T, 275 * _T, 0.0, 32 * _GIB, 1200 * _GB, 2400 * _GB / 8 * 1, "3d-torus",
               25 * _GB / 4, 4096, 128, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("v5e", 197 * _T, 394 * _T, 0.0, 16 * _GIB, 819 * _GB, 1600 * _GB / 8, "2d-torus",
                25 * _GB / 4, 256, 128, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("v5p", 459 * _T, 918 * _T, 0.0, 95 * _GIB, 2765 * _GB, 4800 * _GB / 8, "3d-torus",
                25 * _GB / 4, 8960, 128, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("v6e", 918 * _T, 1836 * _T, 0.0, 32 * _GIB, 1640 * _GB, 3200 * _GB / 8, "2d-torus",
                25 * _GB / 4, 256, 256, "https://cloud.google.com/tpu/docs/v6e"),
    "v7x": Chip("v7x", 2307 * _T, 4614 * _T, 4614 * _T, 192 * _GIB, 7380 * _GB, 1200 * _GB / 2, "3d-torus",
                25 * _GB / 4, 9216, 256, "https://cloud.google.com/tpu/docs/tpu7x"),
}


def chip(name: str) -> Chip:
    """The chip called ``name`` ("v5e", "v7x", ...); a clear error for unknown names."""
    key = name.lower().removeprefix("tpu").removeprefix("-")
    key = {"7x": "v7x", "ironwood": "v7x", "trillium": "v6e", "v5litepod": "v5e"}.get(key, key)
    if key not in CHIPS:
        raise ValueError(f"unknown TPU generation {name!r}; known: {', '.join(CHIPS)}")
    return CHIPS[key]
