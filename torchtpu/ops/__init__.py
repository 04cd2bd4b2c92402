"""The lowering table, one module per op family. Importing this package fills it."""

from . import registry  # noqa: F401
from . import pointwise  # noqa: F401
