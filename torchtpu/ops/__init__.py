"""The lowering table, one module per op family. Importing this package fills it."""

from . import (  # noqa: F401
    conv,
    factory,
    indexing,
    linalg,
    nn,
    pointwise,
    random,
    reduction,
    registry,
    rnn,
    shape,
)
from . import foreach  # noqa: F401,E402  (after the per-tensor lowerings it maps onto)
