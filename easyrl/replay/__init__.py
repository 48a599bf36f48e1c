"""easyrl.replay: replay tables built by composition, their sum tree and rate limiter.

* ``Table``: one columnar numpy ring buffer with global int64 keys, composed with a
  sampler (``Uniform``, ``Prioritized``, ``Fifo``) and a remover (a ring overwrites its
  oldest items; ``Table.queue`` removes what a sample returns). ``UniformTable`` and
  ``PrioritizedTable`` name the two rings; ``make_table`` builds a shard's table from the
  config's ``replay`` section.
* ``RateLimiter``: a non-blocking Reverb-style state machine: a sample-to-insert ratio
  (its constructor), ``RateLimiter.min_size`` or ``RateLimiter.queue``; ``make_limiter``
  pairs one with a table.
* ``FrameStore`` (``frames``): composed into a table, stores the frames of its frame-stack
  columns (Atari observations) once each and rebuilds the stacks when it samples;
  ``layout_for`` finds a run's ``FrameLayout`` (which columns, how a stack splits).
* ``AggregateTable``: the synchronous rounds of PPO/ES (a round is released whole).
* ``SumTree``: the vectorized sum tree behind proportional prioritized sampling.
"""

from easyrl.replay.aggregate import AggregateTable
from easyrl.replay.frames import FrameLayout, FrameStore, layout_for
from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.sumtree import SumTree
from easyrl.replay.tables import (
    Fifo,
    Prioritized,
    PrioritizedTable,
    SampleBatch,
    Sampler,
    Table,
    TableSpec,
    Uniform,
    UniformTable,
    item_bytes,
    make_limiter,
    make_table,
    validate_batch,
    validate_spec,
)

__all__ = [
    "AggregateTable",
    "Fifo",
    "FrameLayout",
    "FrameStore",
    "Prioritized",
    "PrioritizedTable",
    "RateLimiter",
    "SampleBatch",
    "Sampler",
    "SumTree",
    "Table",
    "TableSpec",
    "Uniform",
    "UniformTable",
    "item_bytes",
    "layout_for",
    "make_limiter",
    "make_table",
    "validate_batch",
    "validate_spec",
]
