"""What a memory shard holds: one table and the rules that admit its operations.

`roles.memory.MemoryServer` serves any `ServedTable`: its gRPC handler threads call the
`check_*` methods (which read only what never changes: the spec, the capacity), its table
thread calls the others, one at a time. The server keeps what every kind shares: the
queue of operations, the pending list with deadlines, exactly-once inserts, the prefetch
queue and the snapshot files. A served table answers with the plain records below; the
server turns them into replies. Two implementations ship:

* `LimitedTable`: a `Table` (ring or queue) paired with its `RateLimiter`; learners
  sample batches of `batch_size` items, the server keeps some sampled ahead;
* `easyrl.replay.aggregate.AggregateTable`: an Insert carries its weight round, a Sample
  for round r waits until the round is complete, then takes all of it.

A replay kind (`easyrl.replay.kinds`) builds one of these, or a table of its own.
"""

from typing import Any, Protocol

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.sampled import Batch, NotReady, Sampled
from easyrl.replay.tables import Table, TableSpec


class BetaSchedule:
    """Importance-sampling exponent annealed linearly over sampled batches."""

    def __init__(self, start: float, final: float, steps: int):
        self.start, self.final, self.steps = start, final, steps

    def __call__(self, batches: int) -> float:
        if self.steps <= 0:
            return self.start
        frac = min(1.0, batches / self.steps)
        return self.start + frac * (self.final - self.start)


class ServedTable(Protocol):
    """A memory shard's table as its server uses it (see the module docstring)."""

    batch_size: int
    """Items of the largest Sample reply: a learner's batch, or a whole round."""
    prefetch: bool
    """Whether the server samples batches of `batch_size` ahead (`try_sample` with round 0)."""

    @property
    def spec(self) -> TableSpec:
        """The item's columns: {name: (shape, dtype)} (frame stacks whole)."""
        ...

    @property
    def capacity(self) -> int:
        """Most items held at once."""
        ...

    @property
    def size(self) -> int:
        """Items held now."""
        ...

    @property
    def inserted(self) -> int:
        """Items ever stored (restored snapshots' included)."""
        ...

    @property
    def round(self) -> int:
        """The round being collected (0 for a table without rounds)."""
        ...

    def check_insert(
        self, batch: Batch, priorities: np.ndarray | None, round_: int
    ) -> tuple[Batch, int]:
        """Checks an Insert on its handler thread, before it is queued; nothing changes.

        Returns:
            The batch as `try_insert` takes it (e.g. frame stacks packed) and its items.

        Raises:
            ReplayError: the batch, its priorities or its round do not fit the table.
        """
        ...

    def try_insert(
        self, batch: Batch, n: int, priorities: np.ndarray | None, round_: int, source: int
    ) -> bool | None:
        """Stores a checked batch of `n` items from actor `source` if its turn has come.

        Returns:
            True: stored; False: refused for good (stale: counted, not stored); None: not
            now (the rate limiter or the room it needs), asked again later.
        """
        ...

    def check_sample(self, batch_size: int, round_: int) -> None:
        """Checks a Sample on its handler thread.

        Raises:
            ReplayError: the batch size or round cannot be served by this table.
        """
        ...

    def try_sample(self, batch_size: int, round_: int) -> Sampled | NotReady | None:
        """Samples if allowed now (None: not yet, asked again until the deadline).

        Raises:
            ReplayError: no such sample can be drawn (e.g. every priority is zero).
        """
        ...

    def update_priorities(self, keys: np.ndarray, priorities: Any) -> int:
        """Sets the priorities of stored items; returns how many were applied.

        Raises:
            ReplayError: the table has no priorities, or an update is invalid.
        """
        ...

    def status(self) -> dict[str, float]:
        """The table's own counters for Status (names without the shard prefix)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The table's snapshot (`Table.state_dict`'s format).

        Raises:
            ReplayError: this table is not snapshotted.
        """
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a snapshot of `state_dict`.

        Raises:
            ReplayError: the snapshot does not fit the table; nothing changed.
        """
        ...


class LimitedTable:
    """A `Table` (a ring or a queue) served with its rate limiter.

    Args:
        table: the table.
        limiter: its rate limiter (`RateLimiter.queue(table)` for a queue).
        batch_size: a learner's batch size (prefetched batches have this size), >= 1.
        beta: the importance-sampling exponent by sampled batches (None: 0, weights 1).

    Raises:
        ReplayError: batch_size < 1.
    """

    prefetch = True

    def __init__(
        self,
        table: Table,
        limiter: RateLimiter,
        batch_size: int,
        beta: BetaSchedule | None = None,
    ) -> None:
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, got {batch_size}")
        self.table, self.limiter, self.batch_size = table, limiter, batch_size
        self.beta = BetaSchedule(0.0, 0.0, 0) if beta is None else beta
        self.batches = 0
        """Batches sampled so far (the beta schedule's clock)."""

    @property
    def spec(self) -> TableSpec:
        """The item's columns."""
        return self.table.spec

    @property
    def capacity(self) -> int:
        """Most items held at once."""
        return self.table.capacity

    @property
    def size(self) -> int:
        """Items held now."""
        return self.table.size

    @property
    def inserted(self) -> int:
        """Items ever stored (restored snapshots' included)."""
        return self.table.inserted

    @property
    def round(self) -> int:
        """No rounds: 0."""
        return 0

    def check_insert(
        self, batch: Batch, priorities: np.ndarray | None, round_: int
    ) -> tuple[Batch, int]:
        """Checks the batch (e.g. more unrolls than a queue ever holds); frame stacks are
        split and matched here, on the handler thread, not by the table thread."""
        n = self.table.check_insert(batch, priorities)
        return self.table.storage.wire(batch), n

    def try_insert(
        self, batch: Batch, n: int, priorities: np.ndarray | None, round_: int, source: int
    ) -> bool | None:
        """Stores the batch when the rate limiter allows it and it fits (a queue's room)."""
        if not self.limiter.can_insert(n) or not self.table.fits(batch):
            return None
        self.table.insert(batch, priorities, source=source)
        self.limiter.on_insert(n)
        return True

    def check_sample(self, batch_size: int, round_: int) -> None:
        """A batch of 1 to `capacity` items."""
        if not 1 <= batch_size <= self.table.capacity:
            raise ReplayError(f"batch_size must be in [1, {self.table.capacity}]")

    def try_sample(self, batch_size: int, round_: int) -> Sampled | None:
        """Samples `batch_size` items when the rate limiter allows it."""
        if not self.limiter.can_sample(batch_size):
            return None
        sample = self.table.sample(batch_size, self.beta(self.batches))
        self.limiter.on_sample(batch_size)
        self.batches += 1
        return sample

    def update_priorities(self, keys: np.ndarray, priorities: Any) -> int:
        """See `Table.update_priorities`."""
        return self.table.update_priorities(keys, priorities)

    def status(self) -> dict[str, float]:
        """Items ever stored, batches sampled and the storage's counters (a frame store's
        frames)."""
        table = self.table
        status = {"inserted": float(table.inserted), "sample_batches": float(self.batches)}
        return {**status, **table.storage.status()}

    def state_dict(self) -> dict[str, Any]:
        """See `Table.state_dict`."""
        return self.table.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See `Table.load_state_dict`."""
        self.table.load_state_dict(state)
