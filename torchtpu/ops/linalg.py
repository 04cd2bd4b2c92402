"""Lowerings: linalg ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .common import Promotion, elementwise, promote
from .registry import aten, lower
