"""easyrl.replay: replay tables built by composition, their sum tree and rate limiter.

* ``Table``: one columnar numpy ring buffer with global int64 keys, composed with a
  sampler (``Uniform``, ``Prioritized``, ``Fifo``) and a remover (a ring overwrites its
  oldest items; ``Table.queue`` removes what a sample returns). ``UniformTable`` and
  ``PrioritizedTable`` name the two rings.
* ``RateLimiter``: a non-blocking Reverb-style state machine: a sample-to-insert ratio
  (its constructor), ``RateLimiter.min_size`` or ``RateLimiter.queue``.
* ``kinds``: the replay kinds ``replay.kind`` names, one ``Kind`` object each, registered
  in one place; a kind builds a memory shard's ``ServedTable`` (``served``:
  ``LimitedTable``, a table with its rate limiter, or an ``AggregateTable``).
* ``Storage`` (``storage``): where a table's columns live: ``Columns`` (as they are) or
  ``FrameColumns`` (frame stacks as ids into a ``FrameStore``).
* ``FrameStore`` (``frames``): under a table's ``FrameColumns``, stores the frames of its
  frame-stack columns (Atari observations) once each, for the stacks a sample rebuilds;
  ``layout_for`` finds a run's ``FrameLayout`` (which columns, how a stack splits).
* ``AggregateTable``: the synchronous rounds of PPO/ES (a round is released whole).
* ``SumTree``: the vectorized sum tree behind proportional prioritized sampling.
"""

from easyrl.replay import kinds
from easyrl.replay.aggregate import AggregateTable
from easyrl.replay.checks import validate_batch, validate_spec
from easyrl.replay.frames import FrameLayout, FrameStore, layout_for
from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.sampled import Batch, NotReady, Sampled
from easyrl.replay.served import (
    BetaSchedule,
    LimitedTable,
    ServedTable,
)
from easyrl.replay.storage import Columns, FrameColumns, Storage
from easyrl.replay.sumtree import SumTree
from easyrl.replay.tables import (
    Fifo,
    Prioritized,
    PrioritizedTable,
    Sampler,
    Table,
    TableSpec,
    Uniform,
    UniformTable,
    item_bytes,
)

__all__ = [
    "Batch",
    "AggregateTable",
    "BetaSchedule",
    "Columns",
    "Fifo",
    "FrameColumns",
    "FrameLayout",
    "FrameStore",
    "LimitedTable",
    "NotReady",
    "Prioritized",
    "PrioritizedTable",
    "RateLimiter",
    "Sampled",
    "Sampler",
    "ServedTable",
    "Storage",
    "SumTree",
    "Table",
    "TableSpec",
    "Uniform",
    "UniformTable",
    "item_bytes",
    "kinds",
    "layout_for",
    "validate_batch",
    "validate_spec",
]
