"""The tpu random stream: a seed plus a counter, folded into a PRNG key per program.

Each program that draws takes the next counter value, so a seed replays the
same stream, and the state is just two integers that ``get_rng_state`` packs.
``key(seed, offset)`` is the one way every executor turns them into a key.
"""

import threading

import jax
import jax.numpy as jnp
import torch

_DEFAULT_SEED = 67280421310721
_lock = threading.Lock()
_seed = _DEFAULT_SEED
_offset = 0


def manual_seed(seed: int) -> None:
    global _seed, _offset
    with _lock:
        _seed, _offset = int(seed) % (1 << 63), 0


def initial_seed() -> int:
    return _seed


def next_seed_and_offset(generator: torch.Generator | None = None) -> tuple:
    """The program arguments for the next draw: (32-bit seed, offset), as Python ints.

    With a ``torch.Generator(device="tpu")`` the draw comes from that
    generator's own seed and counter instead of the global stream."""
    if generator is not None:
        return _generator_draw(generator)
    global _offset
    with _lock:
        offset = _offset
        _offset += 1
    return _seed % (1 << 32), offset


def _generator_draw(generator: torch.Generator) -> tuple:
    if generator.device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")
    with _lock:
        offset = generator.get_offset()
        generator.set_offset(offset + 1)
    return generator.initial_seed() % (1 << 32), offset


def key(seed, offset):
    """The PRNG key of one draw, inside a traced program."""
    return jax.random.fold_in(jax.random.key(jnp.asarray(seed).astype(jnp.uint32)), offset)


def get_state() -> torch.Tensor:
    return torch.tensor([_seed, _offset], dtype=torch.int64).view(torch.uint8)


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    seed, offset = state.detach().cpu().contiguous().view(torch.int64).tolist()
    with _lock:
        _seed, _offset = seed, offset
