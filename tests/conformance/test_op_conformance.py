"""The CI slice of the OpInfo conformance sweep: a fixed, representative set of entries.

Each test is one check (entry, kind, dtype) over every OpInfo sample; see
harness.py.  Known failures come from expected_failures.py and are
xfail(strict=True), so a fix shows up as an unexpected pass.  The full sweep
over every entry is ./scripts/op_conformance.sh.
"""

from __future__ import annotations

import pytest

from conformance import harness
from conformance.expected_failures import EXPECTED_FAILURES

# One or two entries per op family, chosen to exercise the rare semantics OpInfo
# samples carry: NaN/inf, 0-dim, empty and broadcast inputs, keepdim, integer
# overflow and rounding, negative and out-of-range indices, duplicate indices
# with accumulate=True, stable sort, random ops.
SLICE = [
    # pointwise: promotion, rounding, NaN/inf
    "add", "mul", "div.floor_rounding", "remainder", "pow", "exp", "nn.functional.gelu",
    "where", "clamp", "isnan", "bitwise_and",
    # reductions: keepdim, empty, dim lists
    "sum", "mean", "amax", "argmax", "var", "logsumexp", "cumsum",
    # indexing: negative/out-of-range indices, duplicates, accumulate
    "index_select", "gather", "scatter_add", "index_put", "index_add", "take_along_dim", "masked_fill",
    # shape and views
    "cat", "reshape", "permute", "narrow", "expand", "flip",
    # sorting (sort: stable and unstable samples)
    "sort", "topk", "msort",
    # linear algebra
    "matmul", "addmm", "bmm",
    # nn
    "softmax", "nn.functional.layer_norm", "nn.functional.cross_entropy",
    "nn.functional.conv2d", "nn.functional.avg_pool2d", "nn.functional.embedding",
    # random (shape, dtype and statistics only)
    "bernoulli", "nn.functional.dropout",
]

# Entries with hundreds of samples per dtype run only these dtypes here.
SLICE_DTYPES = {"sort": ("float32", "int64", "bool")}


def _params():
    ops = harness.ops_by_name()
    params = []
    for name in SLICE:
        for kind, dtype in harness.checks_for(ops[name]):
            if dtype not in SLICE_DTYPES.get(name, harness.DTYPES):
                continue
            reason = EXPECTED_FAILURES.get((name, kind, dtype))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(name, kind, dtype, marks=marks, id=f"{name}-{kind}-{dtype}"))
    return params


@pytest.mark.parametrize("name,kind,dtype", _params())
def test_op_conformance(name, kind, dtype):
    op = harness.ops_by_name()[name]
    with harness.time_limit(120):
        result = harness.run_check(op, kind, dtype)
    assert result.total > 0 or kind == "errors", f"{name} generated no samples"
    assert result.ok, f"{result.passed}/{result.total} samples pass; first failure: {result.reason}"
