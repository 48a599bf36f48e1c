"""easyrl.replay: replay tables, their sum tree and the Reverb-style rate limiter.

* ``UniformTable`` / ``PrioritizedTable``: columnar numpy ring buffers with global int64
  keys, batch insert, batch sample and priority updates.
* ``SumTree``: the vectorized sum tree behind proportional prioritized sampling.
* ``RateLimiter``: a non-blocking sample-to-insert ratio state machine.
"""

from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.sumtree import SumTree
from easyrl.replay.tables import (
    PrioritizedTable,
    SampleBatch,
    TableSpec,
    UniformTable,
    validate_batch,
    validate_spec,
)

__all__ = [
    "PrioritizedTable",
    "RateLimiter",
    "SampleBatch",
    "SumTree",
    "TableSpec",
    "UniformTable",
    "validate_batch",
    "validate_spec",
]
