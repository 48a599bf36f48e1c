"""Replay tables by composition: a storage, a sampler and a remover.

Every insert into a `Table` issues global int64 keys from an insertion counter: item ``k``
lives in slot ``k % capacity``; the stored keys are ``[inserted - size, inserted)``. What
varies is composed in, as Dopamine and Reverb do it:

* the storage (`easyrl.replay.storage`) holds the items of the slots: `Columns`, one
  preallocated numpy array ``[capacity, *shape]`` per column, or `FrameColumns`, which keeps
  each frame of frame-stack columns once (a write may then make the oldest items stale: the
  table drops them);
* the sampler (Dopamine's sampling distribution) picks a sample's items: `Uniform` (with
  replacement), `Prioritized` (proportional, by a sum tree) or `Fifo` (the oldest first);
* the remover: a ring overwrites its oldest items when full; a queue
  (``remove_on_sample``) refuses an insert that does not fit and removes what a sample
  returns, so every item goes to exactly one sample.

`Table.queue` is the trajectory FIFO of IMPALA-style learning (Reverb's ``Table.queue``:
FIFO sampler, remove-on-sample, paired with `RateLimiter.queue`). The replay kinds
(`easyrl.replay.kinds`) build a memory shard's table and limiter from the config's
``replay`` section. Inserts, samples and priority updates are vectorized over the batch; no Python
loop runs per item.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.checks import (
    TableSpec,
    check_indices,
    check_int,
    check_real,
    validate_spec,
)
from easyrl.replay.frames import FrameStore
from easyrl.replay.sampled import Sampled
from easyrl.replay.storage import Storage, live_slots, storage_for
from easyrl.replay.sumtree import SumTree

_NO_PRIORITIES = np.zeros(0)


def item_bytes(spec: Mapping[str, tuple[Sequence[int], Any]]) -> int:
    """Bytes of one item of `spec` ({column: (shape, dtype)}, dtypes as ``np.dtype``
    takes them) as the columns hold it (frame stacks whole)."""
    return sum(
        int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        for shape, dtype in spec.values()
    )


def check_priorities(priorities: Any, n: int) -> np.ndarray:
    """Convert and check a priority vector.

    Returns:
        ``[n]`` float64 priorities.

    Raises:
        ReplayError: If the shape is not ``[n]`` or a priority is non-finite or negative.
    """
    try:
        values = np.asarray(priorities, dtype=np.float64)  # [n]
    except (TypeError, ValueError) as err:
        raise ReplayError(f"priorities must be numeric, got {priorities!r}") from err
    if values.shape != (n,):
        raise ReplayError(f"priorities must have shape ({n},), got {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        bad = values[~(np.isfinite(values) & (values >= 0))]
        raise ReplayError(f"priorities must be finite and >= 0, got {bad[:5]}")
    return values


class Sampler(Protocol):
    """How a `Table` picks the items of a sample and what it keeps per item to do so (the
    defaults: nothing)."""

    state_keys: tuple[str, ...] = ()
    """Entries the sampler adds to the table's ``state_dict``."""

    def check_priorities(self, priorities: Any, n: int) -> np.ndarray:
        """Checks an insert's priorities (None: none given) before the table changes.

        Returns:
            What ``on_insert`` records: ``[n]`` float64 priorities, or an empty array.

        Raises:
            ReplayError: If the priorities are invalid or not accepted.
        """
        ...

    def on_insert(self, slots: np.ndarray, priorities: np.ndarray, first: int) -> None:
        """Records the items just written to ``slots``: the batch's items from ``first``."""

    def on_remove(self, slots: np.ndarray) -> None:
        """Forgets the items of ``slots``, which a ring dropped before their turn (a storage
        write made them stale: their frames are overwritten, `easyrl.replay.storage`)."""

    def sample(
        self, table: "Table", batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Picks ``batch_size`` stored items of the (non-empty) table.

        Returns:
            ``[B]`` slots and the ``[B]`` float64 probability each was drawn with.

        Raises:
            ReplayError: If no such sample can be drawn now.
        """
        ...

    def update(self, table: "Table", keys: Any, priorities: Any) -> int:
        """Sets the priorities of stored items; returns how many were applied.

        Raises:
            ReplayError: If a key was never issued, the priorities are invalid, or the
                sampler has none; nothing is changed then.
        """
        ...

    def state(self, slots: np.ndarray) -> dict[str, Any]:
        """The ``state_keys`` entries for the items in ``slots`` (snapshot order)."""
        return {}

    def load_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        """Restores the ``state_keys`` entries of a snapshot whose items go to ``slots``.

        Raises:
            ReplayError: If an entry is invalid or does not match; nothing is changed then.
        """


class Uniform(Sampler):
    """Uniform sampling with replacement; priorities are checked when given, then ignored."""

    def check_priorities(self, priorities: Any, n: int) -> np.ndarray:
        """Checks the priorities (``[n]``, finite, >= 0) when given; keeps none."""
        if priorities is not None:
            check_priorities(priorities, n)
        return _NO_PRIORITIES

    def sample(
        self, table: "Table", batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` stored items, each drawn with probability ``1 / size``."""
        size = table.size
        slots = (table.removed + rng.integers(0, size, batch_size)) % table.capacity  # [B]
        return slots, np.full(batch_size, 1.0 / size, dtype=np.float64)

    def update(self, table: "Table", keys: Any, priorities: Any) -> int:
        """Checks a priority update and ignores it: 0 applied."""
        array, _ = table.check_keys(keys)
        check_priorities(priorities, array.size)
        return 0


class Fifo(Sampler):
    """The oldest items first; no priorities (a queue's sampler)."""

    def check_priorities(self, priorities: Any, n: int) -> np.ndarray:
        """Refuses priorities."""
        if priorities is not None:
            raise ReplayError("a FIFO table takes no priorities")
        return _NO_PRIORITIES

    def sample(
        self, table: "Table", batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``batch_size`` oldest items (probability 1 each)."""
        if batch_size > table.size:
            raise ReplayError(f"batch_size must be in [1, {table.size}] (items queued)")
        oldest = table.inserted - table.size
        slots = np.arange(oldest, oldest + batch_size) % table.capacity  # [B]
        return slots, np.ones(batch_size, dtype=np.float64)

    def update(self, table: "Table", keys: Any, priorities: Any) -> int:
        """A FIFO has no priorities: always raises ReplayError."""
        raise ReplayError("a FIFO table has no priorities")


class Prioritized(Sampler):
    """Proportional prioritized sampling (Schaul et al., 2016).

    An item of priority ``p`` is stored with weight ``(p + priority_epsilon) ** alpha`` in
    a sum tree and drawn with probability ``P(i) = w_i / sum(w)`` by stratified sampling.
    An insert without priorities gives its items the largest priority seen so far.

    Args:
        capacity: Slots of the table, >= 1.
        alpha: Priority exponent, finite and >= 0 (0 is uniform).
        priority_epsilon: Added to every priority before the exponent, finite and >= 0.

    Raises:
        ReplayError: If an argument is invalid.
    """

    state_keys: tuple[str, ...] = (
        "priorities",
        "max_priority",
        "alpha",
        "priority_epsilon",
        "stale_updates",
    )

    def __init__(self, capacity: int, alpha: float = 0.6, priority_epsilon: float = 1e-6):
        self.tree = SumTree(capacity)
        self.alpha = check_real("alpha", alpha, 0.0)
        self.priority_epsilon = check_real("priority_epsilon", priority_epsilon, 0.0)
        self.max_priority = 1.0
        """Largest raw priority seen so far (initially 1.0), given to new items."""
        self.stale_updates = 0
        """Priority updates skipped so far because their key was overwritten."""

    def _values(self, priorities: np.ndarray) -> np.ndarray:
        """``[K]`` sum-tree weights ``(p + priority_epsilon) ** alpha`` of raw priorities.

        Raises:
            ReplayError: If a weight overflows to infinity.
        """
        with np.errstate(over="ignore"):
            values = (priorities + self.priority_epsilon) ** self.alpha  # [K]
        if not np.all(np.isfinite(values)):
            raise ReplayError(f"priorities overflow (p + eps) ** alpha, alpha={self.alpha}")
        return values

    def check_priorities(self, priorities: Any, n: int) -> np.ndarray:
        """Checks the ``[n]`` raw priorities (None: the largest seen so far for all)."""
        if priorities is None:
            raw = np.full(n, self.max_priority, dtype=np.float64)  # [n]
        else:
            raw = check_priorities(priorities, n)  # [n]
        self._values(raw)
        return raw

    def on_insert(self, slots: np.ndarray, priorities: np.ndarray, first: int) -> None:
        """Enters the stored items' weights in the sum tree."""
        self.tree.update(slots, self._values(priorities[first:]))
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def on_remove(self, slots: np.ndarray) -> None:
        """Zeroes the dropped items' weights: they are never drawn again."""
        self.tree.update(slots, np.zeros(slots.size))

    def sample(
        self, table: "Table", batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional sampling.

        Raises:
            ReplayError: If all stored priorities are zero.
        """
        total = self.tree.total
        if total <= 0:
            raise ReplayError("cannot sample: all stored priorities are zero")
        slots = self.tree.stratified_sample(batch_size, rng)  # [B]
        return slots, self.tree.get(slots) / total

    def update(self, table: "Table", keys: Any, priorities: Any) -> int:
        """Sets the raw priorities of still-stored items.

        Keys already overwritten by the ring are skipped (and counted in
        ``stale_updates``). For a key repeated in one call, the last priority wins.
        """
        array, valid = table.check_keys(keys)  # [K], [K]
        raw = check_priorities(priorities, array.size)  # [K]
        values = self._values(raw)  # [K]
        applied = int(valid.sum())
        self.stale_updates += array.size - applied
        if applied:
            self.tree.update(array[valid] % table.capacity, values[valid])
            self.max_priority = max(self.max_priority, float(raw[valid].max()))
        return applied

    def state(self, slots: np.ndarray) -> dict[str, Any]:
        """``priorities`` (``[size]`` float64 sum-tree weights), ``max_priority``,
        ``alpha``, ``priority_epsilon`` and ``stale_updates``."""
        return {
            "priorities": self.tree.get(slots),
            "max_priority": self.max_priority,
            "alpha": self.alpha,
            "priority_epsilon": self.priority_epsilon,
            "stale_updates": self.stale_updates,
        }

    def load_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        """Restores the sum tree and counters; ``alpha`` and ``priority_epsilon`` must
        match this sampler's."""
        for name, mine in (("alpha", self.alpha), ("priority_epsilon", self.priority_epsilon)):
            if check_real(f"state[{name!r}]", state[name], 0.0) != mine:
                raise ReplayError(f"state dict {name} {state[name]} != table {name} {mine}")
        max_priority = check_real("state['max_priority']", state["max_priority"], 0.0)
        stale = check_int("state['stale_updates']", state["stale_updates"], 0)
        tree = SumTree(self.tree.capacity)
        tree.update(slots, check_priorities(state["priorities"], slots.size))
        self.tree, self.max_priority, self.stale_updates = tree, max_priority, stale


class Table:
    """A replay table: a `Storage` of ``capacity`` items, a sampler and a remover.

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Most items stored, an int >= 1.
        sampler: Picks a sample's items (`Uniform`, `Prioritized` or `Fifo`).
        remove_on_sample: False: a ring that overwrites its oldest items when full. True:
            a queue that refuses an insert that does not fit and removes what a sample
            returns (the sampler must be `Fifo`: it returns the oldest items).
        seed: Seed of the sampling RNG, >= 0.
        frames: Stores the layout's frame-stack columns one frame at a time
            (`easyrl.replay.storage.FrameColumns`): inserts take whole stacks or their wire
            form, samples return whole stacks. A ring then also drops its oldest items early
            when the frames they refer to are overwritten; a queue's insert waits for
            frame room (`fits`). None: every column stored as it is (`Columns`).

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(
        self,
        spec: TableSpec,
        capacity: int,
        sampler: Sampler,
        *,
        remove_on_sample: bool = False,
        seed: int = 0,
        frames: FrameStore | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ReplayError(f"capacity must be an int >= 1, got {capacity!r}")
        if remove_on_sample and not isinstance(sampler, Fifo):
            raise ReplayError("only a FIFO sampler can remove what it samples")
        self._spec = validate_spec(spec)
        self._rng = np.random.default_rng(check_int("seed", seed, 0))
        self.capacity = int(capacity)
        self.sampler = sampler
        self.remove_on_sample = remove_on_sample
        self.inserted = 0
        """Items ever inserted (the key of the next item)."""
        self.removed = 0
        """Items ever removed by samples (a queue's), or dropped by a ring before their turn
        because a write made them stale (otherwise a ring overwrites instead)."""
        self.storage: Storage = storage_for(self._spec, self.capacity, frames, remove_on_sample)
        """Where the items' columns live."""

    @staticmethod
    def queue(spec: TableSpec, capacity: int, frames: FrameStore | None = None) -> "Table":
        """Reverb's ``Table.queue``: a FIFO that removes what a sample returns (pair it
        with ``RateLimiter.queue``: inserts wait for room, samples for items).

        Raises:
            ReplayError: If an argument is invalid.
        """
        return Table(spec, capacity, Fifo(), remove_on_sample=True, frames=frames)

    @property
    def spec(self) -> TableSpec:
        """A copy of the normalised spec: column name -> (shape, ``np.dtype``)."""
        return dict(self._spec)

    @property
    def frames(self) -> FrameStore | None:
        """The frame store under the frame-stack columns, or None."""
        return self.storage.frames

    @property
    def dropped(self) -> int:
        """Items a ring dropped early because a write made them stale (their frames were
        overwritten)."""
        return self.storage.dropped

    @property
    def size(self) -> int:
        """Number of items currently stored."""
        return min(self.inserted - self.removed, self.capacity)

    @property
    def _live(self) -> range:
        """The keys of the stored items, the oldest first."""
        return range(self.inserted - self.size, self.inserted)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays that hold the items (columns, frames, frame bookkeeping)."""
        return self.storage.nbytes

    def _checked(self, batch: dict[str, Any], priorities: Any) -> tuple[int, np.ndarray]:
        n = self.storage.check(batch)
        recorded = self.sampler.check_priorities(priorities, n)
        if self.remove_on_sample and n > self.capacity:
            raise ReplayError(f"{n} items never fit a queue of {self.capacity}")
        return n, recorded

    def check_insert(self, batch: dict[str, Any], priorities: Any = None) -> int:
        """Checks what an insert can be refused for whatever the table holds.

        Returns:
            The batch size ``n``.

        Raises:
            ReplayError: If the batch or priorities are invalid, or a queue can never
                hold ``n`` items (or their frames).
        """
        return self._checked(batch, priorities)[0]

    def fits(self, batch: dict[str, Any]) -> bool:
        """Whether the storage takes a checked batch now without dropping items the table
        must keep: always, except in a queue with a frame store whose oldest frames still
        belong to queued items (the insert then waits for samples to remove them, as it
        waits for item room)."""
        return self.storage.fits(batch, self._live)

    def insert(
        self, batch: dict[str, Any], priorities: Any = None, *, source: int = 0
    ) -> np.ndarray:
        """Appends a batch; a ring that cannot hold it all keeps only its last items.

        Args:
            batch: Column name -> ``[n, *shape]`` arrays matching the spec (a table with a
                frame store also takes the wire form, `easyrl.replay.frames`).
            priorities: ``[n]`` finite raw priorities >= 0, or None (see the sampler).
            source: Who sent the batch (the actor): a ring's frame store matches the
                batch's frames against this source's previous insert.

        Returns:
            ``[n]`` int64 keys issued to the batch's items.

        Raises:
            ReplayError: If the batch or priorities are invalid, or a queue lacks room for
                them (or their frames); the table is unchanged.
        """
        n, recorded = self._checked(batch, priorities)
        if self.remove_on_sample and self.size + n > self.capacity:
            raise ReplayError(
                f"queue full: {self.size} of {self.capacity} items queued, cannot add {n}"
            )
        keys = np.arange(self.inserted, self.inserted + n, dtype=np.int64)  # [n]
        first = n - min(n, self.capacity)
        slots = keys[first:] % self.capacity  # [m], distinct
        live = self._live
        stale = self.storage.write(slots, batch, first, source, live)
        if stale:  # the oldest items refer to what the write overwrote: drop them
            self.sampler.on_remove(live_slots(live[:stale], self.capacity))
            self.removed = live.start + stale
        self.inserted += n
        self.sampler.on_insert(slots, recorded, first)
        return keys

    def sample(self, batch_size: int, beta: float | None = None) -> Sampled:
        """Draws ``batch_size`` items (a queue removes them).

        Importance weights are ``w_i = (size * P(i)) ** -beta`` divided by the batch max.

        Args:
            batch_size: Items to draw, >= 1.
            beta: Importance-sampling exponent in ``[0, 1]``; None means 0 (all weights 1).

        Returns:
            The batch.

        Raises:
            ReplayError: If ``batch_size`` < 1, ``beta`` is invalid, the table is empty,
                or the sampler cannot draw the batch now.
        """
        batch_size = check_int("batch_size", batch_size, 1)
        beta = 0.0 if beta is None else check_real("beta", beta, 0.0, 1.0)
        if self.size == 0:
            raise ReplayError("cannot sample from an empty table")
        slots, probabilities = self.sampler.sample(self, batch_size, self._rng)  # [B], [B]
        weights = (self.size * probabilities) ** -beta  # [B]
        oldest = self.inserted - self.size
        batch = Sampled(
            keys=(oldest + (slots - oldest) % self.capacity).astype(np.int64),
            weights=(weights / weights.max()).astype(np.float32),
            probabilities=probabilities,
            data=self.storage.gather(slots),
        )
        if self.remove_on_sample:
            self.removed += batch_size
        return batch

    def check_keys(self, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """Validate keys and find those still stored.

        Returns:
            ``(keys, valid)``: ``[K]`` int64 keys and the ``[K]`` bool mask of those
            still stored (not overwritten or removed).

        Raises:
            ReplayError: If ``keys`` is not a 1-D integer array or holds a key never
                issued (``< 0`` or ``>= inserted``).
        """
        array = check_indices("keys", keys)  # [K]
        never_issued = (array < 0) | (array >= self.inserted)  # [K]
        if np.any(never_issued):
            raise ReplayError(
                f"keys {array[never_issued][:5]} were never issued "
                f"(valid keys are in [0, {self.inserted}))"
            )
        return array, array >= self.inserted - self.size

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Sets the raw priorities of still-stored items (see the sampler).

        Args:
            keys: ``[K]`` integer keys.
            priorities: ``[K]`` finite raw priorities >= 0.

        Returns:
            The number of updates applied.

        Raises:
            ReplayError: If a key was never issued, the priorities are invalid, or the
                sampler has no priorities; nothing is changed then.
        """
        return self.sampler.update(self, keys, priorities)

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the table (the sampling RNG is not included).

        Returns:
            ``capacity`` and ``inserted`` (and a queue's or a frame table's ``removed``)
            ints, the storage's entries for the stored items (`Storage.state`: the
            ``data/<column>`` arrays of shape ``[size, *shape]``, in slot order for a
            ring, the oldest first for a queue; a frame table's frame-stack columns as
            frame ids and its ``frames/`` entries) and the sampler's entries.
        """
        slots = (self.removed + np.arange(self.size)) % self.capacity  # [size]
        state: dict[str, Any] = {"capacity": self.capacity, "inserted": self.inserted}
        if self._counts_removed:
            state["removed"] = self.removed
        return {**state, **self.storage.state(slots), **self.sampler.state(slots)}

    @property
    def _counts_removed(self) -> bool:
        """Whether ``removed`` can be non-zero (and is part of a snapshot)."""
        return self.remove_on_sample or self.storage.drops_items

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot from ``state_dict``: the same items, keys and counters.

        Raises:
            ReplayError: If the snapshot does not match this table (entries, capacity,
                columns, the sampler's configuration); the table is unchanged.
        """
        counters = ["capacity", "inserted", *(["removed"] if self._counts_removed else [])]
        expected = {*counters, *self.storage.state_keys, *self.sampler.state_keys}
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected, key=str)
        if missing or extra:
            raise ReplayError(f"state dict mismatch: missing {missing}, unexpected {extra}")
        capacity = check_int("state['capacity']", state["capacity"], 1)
        if capacity != self.capacity:
            raise ReplayError(f"state dict capacity {capacity} != table capacity {self.capacity}")
        inserted = check_int("state['inserted']", state["inserted"], 0)
        removed = check_int("state['removed']", state.get("removed", 0), 0)
        if removed > inserted or (self.remove_on_sample and inserted - removed > capacity):
            raise ReplayError(
                f"state dict holds {inserted - removed} items for capacity {capacity}"
            )
        size = min(inserted - removed, capacity)
        checked = self.storage.check_state(state, size)
        slots = (removed + np.arange(size)) % capacity  # [size]
        self.sampler.load_state(state, slots)
        self.inserted, self.removed = inserted, removed
        self.storage.load_state(checked, slots, self._live)


class UniformTable(Table):
    """A ring sampled uniformly with replacement.

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Maximum number of stored items, >= 1; older items are overwritten.
        seed: Seed of the sampling RNG, >= 0.
        frames: The frame store of its frame-stack columns, or None (see `Table`).

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(
        self, spec: TableSpec, capacity: int, seed: int = 0, frames: FrameStore | None = None
    ) -> None:
        super().__init__(spec, capacity, Uniform(), seed=seed, frames=frames)


class PrioritizedTable(Table):
    """A ring with proportional prioritized sampling (`Prioritized`).

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Maximum number of stored items, >= 1; older items are overwritten.
        alpha: Priority exponent, finite and >= 0 (0 is uniform).
        seed: Seed of the sampling RNG, >= 0.
        priority_epsilon: Added to every priority before the exponent, finite and >= 0.
        frames: The frame store of its frame-stack columns, or None (see `Table`).

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(
        self,
        spec: TableSpec,
        capacity: int,
        alpha: float = 0.6,
        seed: int = 0,
        priority_epsilon: float = 1e-6,
        frames: FrameStore | None = None,
    ) -> None:
        self.prioritized = Prioritized(capacity, alpha, priority_epsilon)
        super().__init__(spec, capacity, self.prioritized, seed=seed, frames=frames)

    @property
    def priority_epsilon(self) -> float:
        """Constant added to priorities before the exponent."""
        return self.prioritized.priority_epsilon

    @property
    def max_priority(self) -> float:
        """Largest raw priority seen so far (initially 1.0), given to new items."""
        return self.prioritized.max_priority

    @property
    def stale_updates(self) -> int:
        """Priority updates skipped so far because their key was overwritten."""
        return self.prioritized.stale_updates

    def priorities(self, keys: Any) -> np.ndarray:
        """``[K]`` float64 sum-tree weights ``(p + eps) ** alpha`` of stored items.

        Raises:
            ReplayError: If a key was never issued or has been overwritten.
        """
        array, valid = self.check_keys(keys)
        if not np.all(valid):
            raise ReplayError(f"keys {array[~valid][:5]} have been overwritten")
        return self.prioritized.tree.get(array % self.capacity)
