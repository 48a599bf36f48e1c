"""Argument checks shared by the replay modules: explicit errors, no silent coercion; the item
spec of a table (`TableSpec`) and its checks (`validate_spec`, `validate_batch`), which the
tables and the frame store both read."""

import math

import numpy as np

from easyrl.errors import ReplayError


def check_int(name: str, value: object, minimum: int) -> int:
    """Check that ``value`` is an integer (not a bool) >= ``minimum``.

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


def check_real(name: str, value: object, low: float = -math.inf, high: float = math.inf) -> float:
    """Check that ``value`` is a finite real number (not a bool) in ``[low, high]``.

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


def check_indices(name: str, values: object) -> np.ndarray:
    """Check that ``values`` is a 1-D integer array (keys, slots, leaves).

    Returns:
        ``values`` as an int64 array.

    Raises:
        ReplayError: If ``values`` is not 1-D or holds non-integers.
    """
    array = np.asarray(values)
    if array.ndim != 1:
        raise ReplayError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ReplayError(f"{name} must be integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


TableSpec = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Per-column item shape (without the batch dimension) and dtype, by column name."""


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
