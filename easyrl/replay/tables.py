"""Columnar replay tables: a uniform table and a proportional prioritized table.

Both tables keep their items in preallocated numpy ring buffers, one array of shape
``[capacity, *shape]`` per column. Every insert issues global int64 keys from an insertion
counter: item ``k`` lives in slot ``k % capacity``, and a key is valid iff
``inserted - capacity <= key < inserted``. Inserts, samples and priority updates are
vectorized over the batch; no Python loop runs per item.
"""

import math
from typing import Any, NamedTuple

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.sumtree import SumTree

TableSpec = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Per-column item shape (without the batch dimension) and dtype, by column name."""

DATA_PREFIX = "data/"
"""Prefix of the column arrays in a table snapshot (`state_dict`)."""


def _check_int(name: str, value: object, minimum: int) -> int:
    """Check that ``value`` is an integer (not a bool) >= ``minimum``.

    Args:
        name: Argument name used in the error message.
        value: The value to check.
        minimum: Smallest allowed value.

    Returns:
        ``value`` as a Python int.

    Raises:
        ReplayError: If ``value`` is not an integer or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ReplayError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ReplayError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_real(name: str, value: object, low: float, high: float = math.inf) -> float:
    """Check that ``value`` is a finite real number in ``[low, high]``.

    Args:
        name: Argument name used in the error message.
        value: The value to check.
        low: Smallest allowed value.
        high: Largest allowed value.

    Returns:
        ``value`` as a Python float.

    Raises:
        ReplayError: If ``value`` is not a finite number in range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ReplayError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float) or not low <= as_float <= high:
        raise ReplayError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
    return as_float


def validate_spec(spec: TableSpec) -> TableSpec:
    """Check a table spec and normalise it.

    Args:
        spec: Column name -> (item shape, dtype). Shapes are tuples of ints >= 0; dtypes
            are anything ``np.dtype`` accepts except object dtypes.

    Returns:
        A new spec with tuple shapes and ``np.dtype`` dtypes.

    Raises:
        ReplayError: If the spec is empty or a column entry is malformed.
    """
    if not isinstance(spec, dict) or not spec:
        raise ReplayError(f"table spec must be a non-empty dict, got {spec!r}")
    normalised: TableSpec = {}
    for name, entry in spec.items():
        if not isinstance(name, str) or not name:
            raise ReplayError(f"column names must be non-empty strings, got {name!r}")
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise ReplayError(f"column {name!r}: expected (shape, dtype), got {entry!r}")
        shape, dtype = entry
        if not isinstance(shape, tuple) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ReplayError(f"column {name!r}: shape must be a tuple of ints >= 0, got {shape!r}")
        try:
            np_dtype = np.dtype(dtype)
        except TypeError as err:
            raise ReplayError(f"column {name!r}: invalid dtype {dtype!r}") from err
        if np_dtype.hasobject:
            raise ReplayError(f"column {name!r}: object dtypes are not supported")
        normalised[name] = (tuple(int(d) for d in shape), np_dtype)
    return normalised


def validate_batch(spec: TableSpec, batch: dict[str, np.ndarray]) -> int:
    """Check that a batch matches a table spec exactly.

    Args:
        spec: The table spec.
        batch: Column name -> array of shape ``[n, *shape]`` and the spec's dtype.

    Returns:
        The batch size ``n`` (>= 1), the same for all columns.

    Raises:
        ReplayError: Naming the column and the expected vs actual value, if the column
            names differ from the spec, a column is not a numpy array, has another dtype
            or shape, or the columns disagree on ``n``, or ``n`` is 0.
    """
    if not isinstance(batch, dict):
        raise ReplayError(f"batch must be a dict of numpy arrays, got {type(batch).__name__}")
    missing = sorted(set(spec) - set(batch))
    extra = sorted(set(batch) - set(spec), key=str)
    if missing or extra:
        raise ReplayError(
            f"batch columns do not match the table spec: missing {missing}, unexpected {extra}"
        )
    n: int | None = None
    first: str | None = None
    for name, (shape, dtype) in spec.items():
        array = batch[name]
        if not isinstance(array, np.ndarray):
            raise ReplayError(
                f"column {name!r}: expected a numpy array, got {type(array).__name__}"
            )
        if array.dtype != np.dtype(dtype):
            raise ReplayError(
                f"column {name!r}: expected dtype {np.dtype(dtype)}, got {array.dtype}"
            )
        if array.ndim != 1 + len(shape) or tuple(array.shape[1:]) != tuple(shape):
            raise ReplayError(
                f"column {name!r}: expected shape [n, {', '.join(map(str, shape))}]"
                f" = (n, *{tuple(shape)}), got {array.shape}"
            )
        if n is None:
            n, first = array.shape[0], name
        elif array.shape[0] != n:
            raise ReplayError(
                f"column {name!r}: expected batch size {n} (as column {first!r}), "
                f"got {array.shape[0]}"
            )
    if not n:
        raise ReplayError("batch must contain at least one item, got n = 0")
    return n


def _check_priorities(priorities: Any, n: int) -> np.ndarray:
    """Convert and check a priority vector.

    Args:
        priorities: Array-like of ``n`` priorities.
        n: Expected length.

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


def _check_beta(beta: float | None) -> float:
    """Check an importance-sampling exponent.

    Args:
        beta: Exponent in ``[0, 1]``, or None for 0.

    Returns:
        ``beta`` as a float (0.0 for None).

    Raises:
        ReplayError: If ``beta`` is not a finite number in ``[0, 1]``.
    """
    return 0.0 if beta is None else _check_real("beta", beta, 0.0, 1.0)


class SampleBatch(NamedTuple):
    """A sampled batch of items."""

    keys: np.ndarray
    """``[B]`` int64 keys of the sampled items (for ``update_priorities``)."""
    weights: np.ndarray
    """``[B]`` float32 importance weights, normalised by the batch max (ones if uniform)."""
    probabilities: np.ndarray
    """``[B]`` float64 probability with which each item was drawn."""
    data: dict[str, np.ndarray]
    """Column name -> ``[B, *shape]`` copies of the sampled items."""


class _RingBuffer:
    """Preallocated columnar ring buffer with global insertion keys.

    Args:
        spec: Normalised table spec.
        capacity: Number of slots, >= 1.
    """

    def __init__(self, spec: TableSpec, capacity: int) -> None:
        self.spec = spec
        self.capacity = capacity
        self.inserted = 0
        self.columns = {
            name: np.zeros((capacity, *shape), dtype=dtype) for name, (shape, dtype) in spec.items()
        }  # name -> [capacity, *shape]

    @property
    def size(self) -> int:
        """Number of valid items.

        Returns:
            ``min(inserted, capacity)``.
        """
        return min(self.inserted, self.capacity)

    def write(self, batch: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Append a validated batch, keeping only its last ``capacity`` items.

        Args:
            batch: Batch already checked by ``validate_batch``.
            n: Its size.

        Returns:
            ``(keys, slots, first)``: ``[n]`` int64 keys issued for the whole batch,
            ``[m]`` slots written (``m = min(n, capacity)``), and the batch offset
            ``first = n - m`` of the first stored item.
        """
        keys = np.arange(self.inserted, self.inserted + n, dtype=np.int64)  # [n]
        first = n - min(n, self.capacity)
        slots = keys[first:] % self.capacity  # [m], distinct
        for name, column in self.columns.items():
            column[slots] = batch[name][first:]
        self.inserted += n
        return keys, slots, first

    def slots_to_keys(self, slots: np.ndarray) -> np.ndarray:
        """Key of the item currently stored in each slot.

        Args:
            slots: ``[B]`` slots in ``[0, size)``.

        Returns:
            ``[B]`` int64 keys.
        """
        base = max(self.inserted - self.capacity, 0)
        return (base + (slots - base) % self.capacity).astype(np.int64)

    def check_keys(self, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """Validate keys and find those still stored.

        Args:
            keys: ``[K]`` integer keys.

        Returns:
            ``(keys, valid)``: ``[K]`` int64 keys and ``[K]`` bool mask of the keys not yet
            overwritten by the ring.

        Raises:
            ReplayError: If ``keys`` is not a 1-D integer array or holds a key never
                issued (``< 0`` or ``>= inserted``).
        """
        array = np.asarray(keys)
        if array.ndim != 1:
            raise ReplayError(f"keys must be 1-D, got shape {array.shape}")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ReplayError(f"keys must be integers, got dtype {array.dtype}")
        array = array.astype(np.int64, copy=False)
        never_issued = (array < 0) | (array >= self.inserted)  # [K]
        if np.any(never_issued):
            raise ReplayError(
                f"keys {array[never_issued][:5]} were never issued "
                f"(valid keys are in [0, {self.inserted}))"
            )
        return array, array >= self.inserted - self.capacity

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copy the items in ``slots``.

        Args:
            slots: ``[B]`` slots.

        Returns:
            Column name -> ``[B, *shape]`` copies.
        """
        return {name: column[slots] for name, column in self.columns.items()}

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the buffer.

        Returns:
            ``capacity`` and ``inserted`` ints, and ``data/<column>`` arrays of shape
            ``[size, *shape]`` in slot order.
        """
        size = self.size
        state: dict[str, Any] = {"capacity": self.capacity, "inserted": self.inserted}
        for name, column in self.columns.items():
            state[DATA_PREFIX + name] = column[:size].copy()
        return state

    def check_state(self, state: dict[str, Any]) -> int:
        """Validate a snapshot from ``state_dict`` without changing anything.

        Args:
            state: The snapshot.

        Returns:
            The snapshot's ``inserted`` counter.

        Raises:
            ReplayError: If an entry is missing, the capacity differs, or a column does not
                match the spec.
        """
        for entry in ("capacity", "inserted"):
            if entry not in state:
                raise ReplayError(f"state dict lacks {entry!r}")
        capacity = _check_int("state['capacity']", state["capacity"], 1)
        if capacity != self.capacity:
            raise ReplayError(f"state dict capacity {capacity} != table capacity {self.capacity}")
        inserted = _check_int("state['inserted']", state["inserted"], 0)
        size = min(inserted, self.capacity)
        for name, (shape, dtype) in self.spec.items():
            array = state.get(DATA_PREFIX + name)
            if not isinstance(array, np.ndarray):
                raise ReplayError(f"state dict lacks array {DATA_PREFIX + name!r}")
            if array.dtype != dtype or array.shape != (size, *shape):
                raise ReplayError(
                    f"state dict column {name!r}: expected {dtype} {(size, *shape)}, "
                    f"got {array.dtype} {array.shape}"
                )
        return inserted

    def load_state(self, state: dict[str, Any], inserted: int) -> None:
        """Restore a snapshot already checked by ``check_state``.

        Args:
            state: The snapshot.
            inserted: Its ``inserted`` counter.
        """
        size = min(inserted, self.capacity)
        for name, column in self.columns.items():
            column[:size] = state[DATA_PREFIX + name]
            column[size:] = 0
        self.inserted = inserted


class _Table:
    """Behaviour shared by the replay tables: spec, ring buffer, RNG and checks.

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Maximum number of stored items, >= 1.
        seed: Seed of the sampling RNG, >= 0.

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(self, spec: TableSpec, capacity: int, seed: int) -> None:
        self._ring = _RingBuffer(validate_spec(spec), _check_int("capacity", capacity, 1))
        self._rng = np.random.default_rng(_check_int("seed", seed, 0))

    @property
    def spec(self) -> TableSpec:
        """The normalised table spec.

        Returns:
            A copy of column name -> (shape, ``np.dtype``).
        """
        return dict(self._ring.spec)

    @property
    def capacity(self) -> int:
        """Maximum number of stored items.

        Returns:
            The constructor's capacity.
        """
        return self._ring.capacity

    @property
    def size(self) -> int:
        """Number of items currently stored.

        Returns:
            ``min(inserted, capacity)``.
        """
        return self._ring.size

    @property
    def inserted(self) -> int:
        """Number of items ever inserted (the next key to issue).

        Returns:
            The insertion counter.
        """
        return self._ring.inserted

    def _check_sample(self, batch_size: int) -> int:
        """Check that a sample of ``batch_size`` items is possible.

        Args:
            batch_size: Requested items, >= 1.

        Returns:
            ``batch_size`` as an int.

        Raises:
            ReplayError: If ``batch_size`` < 1 or the table is empty.
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        if self._ring.size == 0:
            raise ReplayError("cannot sample from an empty table")
        return batch_size


class UniformTable(_Table):
    """Ring-buffer table sampled uniformly with replacement.

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Maximum number of stored items, >= 1; older items are overwritten.
        seed: Seed of the sampling RNG, >= 0.

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(self, spec: TableSpec, capacity: int, seed: int = 0) -> None:
        super().__init__(spec, capacity, seed)

    def insert(self, batch: dict[str, np.ndarray], priorities: Any = None) -> np.ndarray:
        """Append a batch; if it exceeds the capacity, only its last items are kept.

        Args:
            batch: Column name -> ``[n, *shape]`` arrays matching the spec.
            priorities: Ignored, but checked (``[n]``, finite, >= 0) when given.

        Returns:
            ``[n]`` int64 keys issued to the batch's items.

        Raises:
            ReplayError: If the batch or priorities are invalid; the table is unchanged.
        """
        n = validate_batch(self._ring.spec, batch)
        if priorities is not None:
            _check_priorities(priorities, n)
        keys, _, _ = self._ring.write(batch, n)
        return keys

    def sample(self, batch_size: int, beta: float | None = None) -> SampleBatch:
        """Draw ``batch_size`` items uniformly with replacement.

        Args:
            batch_size: Items to draw, >= 1.
            beta: Ignored (uniform sampling needs no correction), checked to be in
                ``[0, 1]`` when given.

        Returns:
            The batch, with all-ones weights and probabilities ``1 / size``.

        Raises:
            ReplayError: If ``batch_size`` < 1, ``beta`` is invalid, or the table is empty.
        """
        batch_size = self._check_sample(batch_size)
        _check_beta(beta)
        size = self._ring.size
        slots = self._rng.integers(0, size, batch_size)  # [B]
        return SampleBatch(
            keys=self._ring.slots_to_keys(slots),
            weights=np.ones(batch_size, dtype=np.float32),
            probabilities=np.full(batch_size, 1.0 / size, dtype=np.float64),
            data=self._ring.gather(slots),
        )

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Check a priority update and ignore it (uniform tables have no priorities).

        Args:
            keys: ``[K]`` integer keys.
            priorities: ``[K]`` finite priorities >= 0.

        Returns:
            0, the number of updates applied.

        Raises:
            ReplayError: If a key was never issued or the priorities are invalid.
        """
        array, _ = self._ring.check_keys(keys)
        _check_priorities(priorities, array.size)
        return 0

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the table (the sampling RNG is not included).

        Returns:
            ``capacity`` and ``inserted`` ints and ``data/<column>`` arrays of shape
            ``[size, *shape]`` in slot order.
        """
        return self._ring.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot from ``state_dict``.

        Args:
            state: The snapshot; its capacity and columns must match this table.

        Raises:
            ReplayError: If the snapshot does not match; the table is unchanged.
        """
        extra = sorted(set(state) - set(self.state_dict_keys()))
        if extra:
            raise ReplayError(f"state dict has unexpected entries {extra}")
        inserted = self._ring.check_state(state)
        self._ring.load_state(state, inserted)

    def state_dict_keys(self) -> list[str]:
        """Names of the entries of ``state_dict``.

        Returns:
            The entry names.
        """
        return ["capacity", "inserted", *(DATA_PREFIX + name for name in self._ring.spec)]


class PrioritizedTable(_Table):
    """Ring-buffer table with proportional prioritized sampling (Schaul et al., 2016).

    An item of priority ``p`` is stored with weight ``(p + priority_epsilon) ** alpha`` in
    a sum tree and drawn with probability ``P(i) = w_i / sum(w)`` by stratified sampling.

    Args:
        spec: Column name -> (item shape, dtype).
        capacity: Maximum number of stored items, >= 1; older items are overwritten.
        alpha: Priority exponent, finite and >= 0 (0 is uniform).
        seed: Seed of the sampling RNG, >= 0.
        priority_epsilon: Added to every priority before the exponent, finite and >= 0.

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
    ) -> None:
        super().__init__(spec, capacity, seed)
        self._alpha = _check_real("alpha", alpha, 0.0)
        self._epsilon = _check_real("priority_epsilon", priority_epsilon, 0.0)
        self._tree = SumTree(self._ring.capacity)
        self._max_priority = 1.0
        self._stale_updates = 0

    @property
    def alpha(self) -> float:
        """Priority exponent.

        Returns:
            The constructor's ``alpha``.
        """
        return self._alpha

    @property
    def priority_epsilon(self) -> float:
        """Constant added to priorities before the exponent.

        Returns:
            The constructor's ``priority_epsilon``.
        """
        return self._epsilon

    @property
    def max_priority(self) -> float:
        """Largest raw priority seen so far (initially 1.0), given to new items.

        Returns:
            The priority.
        """
        return self._max_priority

    @property
    def stale_updates(self) -> int:
        """Priority updates skipped so far because their key was overwritten.

        Returns:
            The running count.
        """
        return self._stale_updates

    def _tree_values(self, priorities: np.ndarray) -> np.ndarray:
        """Map raw priorities to sum-tree weights.

        Args:
            priorities: ``[K]`` checked raw priorities.

        Returns:
            ``[K]`` float64 ``(p + priority_epsilon) ** alpha``.

        Raises:
            ReplayError: If a weight overflows to infinity.
        """
        with np.errstate(over="ignore"):
            values = (priorities + self._epsilon) ** self._alpha  # [K]
        if not np.all(np.isfinite(values)):
            raise ReplayError(f"priorities overflow (p + eps) ** alpha, alpha={self._alpha}")
        return values

    def priorities(self, keys: Any) -> np.ndarray:
        """Current sum-tree weights ``(p + eps) ** alpha`` of stored items.

        Args:
            keys: ``[K]`` keys still stored in the table.

        Returns:
            ``[K]`` float64 weights.

        Raises:
            ReplayError: If a key was never issued or has been overwritten.
        """
        array, valid = self._ring.check_keys(keys)
        if not np.all(valid):
            raise ReplayError(f"keys {array[~valid][:5]} have been overwritten")
        return self._tree.get(array % self._ring.capacity)

    def insert(self, batch: dict[str, np.ndarray], priorities: Any = None) -> np.ndarray:
        """Append a batch; if it exceeds the capacity, only its last items are kept.

        Args:
            batch: Column name -> ``[n, *shape]`` arrays matching the spec.
            priorities: ``[n]`` finite raw priorities >= 0, or None to give every item
                the largest priority seen so far.

        Returns:
            ``[n]`` int64 keys issued to the batch's items.

        Raises:
            ReplayError: If the batch or priorities are invalid; the table is unchanged.
        """
        n = validate_batch(self._ring.spec, batch)
        if priorities is None:
            raw = np.full(n, self._max_priority, dtype=np.float64)  # [n]
        else:
            raw = _check_priorities(priorities, n)  # [n]
        values = self._tree_values(raw)  # [n]
        keys, slots, first = self._ring.write(batch, n)
        self._tree.update(slots, values[first:])
        self._max_priority = max(self._max_priority, float(raw.max()))
        return keys

    def sample(self, batch_size: int, beta: float | None = None) -> SampleBatch:
        """Draw ``batch_size`` items by stratified proportional sampling.

        Importance weights are ``w_i = (size * P(i)) ** -beta`` divided by the batch max.

        Args:
            batch_size: Items to draw, >= 1.
            beta: Importance-sampling exponent in ``[0, 1]``; None means 0 (all weights 1).

        Returns:
            The batch.

        Raises:
            ReplayError: If ``batch_size`` < 1, ``beta`` is invalid, the table is empty,
                or all stored priorities are zero.
        """
        batch_size = self._check_sample(batch_size)
        beta = _check_beta(beta)
        total = self._tree.total
        if total <= 0:
            raise ReplayError("cannot sample: all stored priorities are zero")
        slots = self._tree.stratified_sample(batch_size, self._rng)  # [B]
        probabilities = self._tree.get(slots) / total  # [B]
        weights = (self._ring.size * probabilities) ** -beta  # [B]
        weights = (weights / weights.max()).astype(np.float32)
        return SampleBatch(
            keys=self._ring.slots_to_keys(slots),
            weights=weights,
            probabilities=probabilities,
            data=self._ring.gather(slots),
        )

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the raw priorities of still-stored items.

        Keys already overwritten by the ring are skipped (and counted in
        ``stale_updates``). For a key repeated in one call, the last priority wins.

        Args:
            keys: ``[K]`` integer keys.
            priorities: ``[K]`` finite raw priorities >= 0.

        Returns:
            The number of updates applied (``K`` minus the skipped stale keys).

        Raises:
            ReplayError: If a key was never issued or the priorities are invalid;
                nothing is changed then.
        """
        array, valid = self._ring.check_keys(keys)  # [K], [K]
        raw = _check_priorities(priorities, array.size)  # [K]
        values = self._tree_values(raw)  # [K]
        applied = int(valid.sum())
        self._stale_updates += array.size - applied
        if applied:
            self._tree.update(array[valid] % self._ring.capacity, values[valid])
            self._max_priority = max(self._max_priority, float(raw[valid].max()))
        return applied

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the table (the sampling RNG is not included).

        Returns:
            The ring entries (``capacity``, ``inserted``, ``data/<column>``) plus
            ``priorities`` (``[size]`` float64 sum-tree weights in slot order),
            ``max_priority``, ``alpha`` and ``priority_epsilon`` floats and the
            ``stale_updates`` int.
        """
        state = self._ring.state_dict()
        state["priorities"] = self._tree.get(np.arange(self._ring.size))
        state["max_priority"] = self._max_priority
        state["alpha"] = self._alpha
        state["priority_epsilon"] = self._epsilon
        state["stale_updates"] = self._stale_updates
        return state

    def state_dict_keys(self) -> list[str]:
        """Names of the entries of ``state_dict``.

        Returns:
            The entry names.
        """
        return [
            "capacity",
            "inserted",
            *(DATA_PREFIX + name for name in self._ring.spec),
            "priorities",
            "max_priority",
            "alpha",
            "priority_epsilon",
            "stale_updates",
        ]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot from ``state_dict``.

        Args:
            state: The snapshot; capacity, columns, ``alpha`` and ``priority_epsilon``
                must match this table.

        Raises:
            ReplayError: If the snapshot does not match; the table is unchanged.
        """
        expected = self.state_dict_keys()
        missing = sorted(set(expected) - set(state))
        extra = sorted(set(state) - set(expected))
        if missing or extra:
            raise ReplayError(f"state dict mismatch: missing {missing}, unexpected {extra}")
        inserted = self._ring.check_state(state)
        size = min(inserted, self._ring.capacity)
        for name, mine in (("alpha", self._alpha), ("priority_epsilon", self._epsilon)):
            if _check_real(f"state[{name!r}]", state[name], 0.0) != mine:
                raise ReplayError(f"state dict {name} {state[name]} != table {name} {mine}")
        max_priority = _check_real("state['max_priority']", state["max_priority"], 0.0)
        stale = _check_int("state['stale_updates']", state["stale_updates"], 0)
        leaves = _check_priorities(state["priorities"], size)  # [size]
        tree = SumTree(self._ring.capacity)
        tree.update(np.arange(size), leaves)
        self._ring.load_state(state, inserted)
        self._tree = tree
        self._max_priority = max_priority
        self._stale_updates = stale
