"""The lowering table, one module per op family. Importing this package fills it."""

from . import (  # noqa: F401
    attention,
    conv,
    factory,
    fft,
    indexing,
    linalg,
    nn,
    pointwise,
    random,
    reduction,
    registry,
    rnn,
    shape,
    special,
)
from . import foreach  # noqa: F401,E402  (after the per-tensor lowerings it maps onto)
