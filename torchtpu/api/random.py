"""``torch.tpu``'s random-number functions: one stream per process (``runtime/rng.py``)."""

from __future__ import annotations

import time

import torch

from ..runtime import rng

def manual_seed(seed: int) -> None:
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    rng.manual_seed(seed)


def seed() -> None:
    rng.manual_seed(time.time_ns() % (1 << 63))


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    rng.set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    set_rng_state(new_states[0])
