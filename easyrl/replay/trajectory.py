"""The trajectory table of IMPALA-style learning: a bounded FIFO of fixed-length unrolls.

An item is one unroll of one environment (T steps, its behaviour logits and the bootstrap
observation). Learners take the oldest items first and every item goes to exactly one
learner batch: a sample removes what it returns. When the queue is full, inserts wait
(`FifoLimiter.can_insert` is False): that is the back-pressure on actors, so the data a
learner trains on is never older than the queue is long.
"""

from typing import Any

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.tables import (
    DATA_PREFIX,
    SampleBatch,
    TableSpec,
    validate_batch,
    validate_spec,
)


class FifoTable:
    """A bounded first-in first-out queue of items in preallocated columnar buffers.

    Args:
        spec: column name -> (item shape, dtype).
        capacity: most items queued at once (>= 1).

    Raises:
        ReplayError: a malformed spec or capacity.
    """

    def __init__(self, spec: TableSpec, capacity: int) -> None:
        self._spec = validate_spec(spec)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ReplayError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self._columns = {
            name: np.zeros((capacity, *shape), dtype=dtype)
            for name, (shape, dtype) in self._spec.items()
        }  # name -> [capacity, *shape]
        self.inserted = 0
        """Items ever inserted (the key of the next item)."""
        self.removed = 0
        """Items ever taken by samples (the key of the oldest queued item)."""

    @property
    def spec(self) -> TableSpec:
        """The table's column spec."""
        return dict(self._spec)

    @property
    def size(self) -> int:
        """Items queued."""
        return self.inserted - self.removed

    def insert(self, batch: dict[str, np.ndarray], priorities: Any = None) -> np.ndarray:
        """Appends the batch's items at the back of the queue.

        Returns:
            `[n]` int64 keys of the items.

        Raises:
            ReplayError: the batch does not match the spec, priorities were given, or the
                items do not fit (nothing is changed then).
        """
        n = validate_batch(self._spec, batch)
        if priorities is not None:
            raise ReplayError("a trajectory table takes no priorities")
        if self.size + n > self.capacity:
            raise ReplayError(
                f"trajectory table full: {self.size} of {self.capacity} items queued, "
                f"cannot add {n}"
            )
        keys = np.arange(self.inserted, self.inserted + n, dtype=np.int64)  # [n]
        slots = keys % self.capacity
        for name, column in self._columns.items():
            column[slots] = batch[name]
        self.inserted += n
        return keys

    def sample(self, batch_size: int, beta: float | None = None) -> SampleBatch:
        """Removes and returns the `batch_size` oldest items (`beta` is ignored).

        Raises:
            ReplayError: `batch_size` is not an int in [1, size].
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise ReplayError(f"batch_size must be an int, got {batch_size!r}")
        if not 1 <= batch_size <= self.size:
            raise ReplayError(f"batch_size must be in [1, {self.size}] (items queued)")
        keys = np.arange(self.removed, self.removed + batch_size, dtype=np.int64)  # [B]
        slots = keys % self.capacity
        data = {name: column[slots].copy() for name, column in self._columns.items()}
        self.removed += batch_size
        return SampleBatch(
            keys=keys,
            weights=np.ones(batch_size, np.float32),
            probabilities=np.ones(batch_size, np.float64),
            data=data,
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the queue.

        Returns:
            ``capacity``, ``inserted`` and ``removed`` ints and ``data/<column>`` arrays of
            shape ``[size, *shape]``, oldest item first.
        """
        slots = np.arange(self.removed, self.inserted) % self.capacity  # [size]
        state: dict[str, Any] = {
            "capacity": self.capacity,
            "inserted": self.inserted,
            "removed": self.removed,
        }
        for name, column in self._columns.items():
            state[DATA_PREFIX + name] = column[slots]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a snapshot from `state_dict`: the same items in the same order, and the
        same counters (so keys continue where they stopped).

        Raises:
            ReplayError: the snapshot does not match this table; the table is unchanged.
        """
        expected = {"capacity", "inserted", "removed", *(DATA_PREFIX + n for n in self._spec)}
        if set(state) != expected:
            raise ReplayError(
                f"state dict mismatch: missing {sorted(expected - set(state))}, "
                f"unexpected {sorted(set(state) - expected)}"
            )
        counts = {}
        for key in ("capacity", "inserted", "removed"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ReplayError(f"state[{key!r}] must be an int >= 0, got {value!r}")
            counts[key] = int(value)
        size = counts["inserted"] - counts["removed"]
        if counts["capacity"] != self.capacity or not 0 <= size <= self.capacity:
            raise ReplayError(
                f"state dict holds {size} items for capacity {counts['capacity']}; "
                f"this table's capacity is {self.capacity}"
            )
        for name, (shape, dtype) in self._spec.items():
            array = state[DATA_PREFIX + name]
            if not isinstance(array, np.ndarray) or array.shape != (size, *shape):
                raise ReplayError(f"state dict column {name!r} is not a {(size, *shape)} array")
            if array.dtype != dtype:
                raise ReplayError(f"state dict column {name!r} is {array.dtype}, not {dtype}")
        slots = np.arange(counts["removed"], counts["inserted"]) % self.capacity
        for name, column in self._columns.items():
            column[slots] = state[DATA_PREFIX + name]
        self.inserted, self.removed = counts["inserted"], counts["removed"]

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """A FIFO has no priorities.

        Raises:
            ReplayError: always.
        """
        raise ReplayError("a trajectory table has no priorities")


class FifoLimiter:
    """The rate limiter of a `FifoTable`: an insert waits while the queue lacks room for
    it, a sample waits until enough items are queued.

    Args:
        table: the queue it guards.
    """

    def __init__(self, table: FifoTable) -> None:
        self.table = table

    def can_insert(self, n: int) -> bool:
        """Whether `n` items fit in the queue now."""
        return self.table.size + n <= self.table.capacity

    def can_sample(self, n: int) -> bool:
        """Whether `n` items are queued."""
        return self.table.size >= n

    def on_insert(self, n: int) -> None:
        """Nothing to record: the table's size is the state."""

    def on_sample(self, n: int) -> None:
        """Nothing to record: the table's size is the state."""

    def check_batch_sizes(self, insert_batch: int, sample_batch: int) -> None:
        """Rejects sizes that can never be served.

        Raises:
            ReplayError: one insert or one sample is larger than the queue.
        """
        if insert_batch > self.table.capacity or sample_batch > self.table.capacity:
            raise ReplayError(
                f"replay.capacity {self.table.capacity} (unrolls) must hold one insert "
                f"({insert_batch}) and one learner batch ({sample_batch})"
            )
