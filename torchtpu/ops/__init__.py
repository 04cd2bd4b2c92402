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
