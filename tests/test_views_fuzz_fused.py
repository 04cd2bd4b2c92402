"""The view/mutation fuzz of test_views_fuzz.py, run in fused eager mode.

It replays that file's property, but compares the state with CPU only at
drawn points and at the end, so several views and mutations build up in one
pending graph before anything reads them back.  Every fused graph is a new
XLA compile, so this runs fewer programs (TORCHTPU_FUSED_FUZZ_EXAMPLES,
default 60).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import test_views_fuzz
import torchtpu  # noqa: F401

EXAMPLES = int(os.environ.get("TORCHTPU_FUSED_FUZZ_EXAMPLES", 60))
_check_state = test_views_fuzz.assert_state_matches
_strict_property = test_views_fuzz.test_random_view_and_mutation_programs_match_cpu.hypothesis.inner_test


@seed(test_views_fuzz.SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if os.environ.get("TORCHTPU_FUZZ_SHRINK") else []),
)
@given(st.data(), st.randoms(use_true_random=False))
def test_random_view_and_mutation_programs_match_cpu_in_fused_mode(data, rng: random.Random):
    last = {}

    def check_sometimes(live, where):
        """Skip most checks (each is a host sync); remember the state for the final one."""
        last["live"], last["where"] = list(live), where
        if rng.random() < 0.25:
            _check_state(live, f"fused: {where}")

    with pytest.MonkeyPatch.context() as patch, torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        patch.setattr(test_views_fuzz, "assert_state_matches", check_sometimes)
        _strict_property(data)
        _check_state(last["live"], f"fused, at the end: {last['where']}")
