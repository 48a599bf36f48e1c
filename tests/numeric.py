"""Numerical references shared by the algorithm tests."""

from collections.abc import Callable, Iterable

import numpy as np


def central_differences(
    params: dict[str, np.ndarray],
    loss: Callable[[dict[str, np.ndarray]], float],
    names: Iterable[str] | None = None,
    h: float = 1e-6,
) -> dict[str, np.ndarray]:
    """d loss(params) / d params[name] for each of `names` (default: every parameter), by
    central differences of step `h` on one entry at a time (float64 parameters)."""
    grads = {}
    for name in params if names is None else names:
        value = params[name]
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            plus, minus = value.copy(), value.copy()
            plus[index] += h
            minus[index] -= h
            up, down = loss({**params, name: plus}), loss({**params, name: minus})
            grad[index] = (up - down) / (2 * h)
        grads[name] = grad
    return grads
