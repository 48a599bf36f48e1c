"""Argument checks shared by the replay modules: explicit errors, no silent coercion."""

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
