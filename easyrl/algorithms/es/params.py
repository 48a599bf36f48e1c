"""ES's numpy side that `agent.py` needs too: the hyper-parameters, its flow and network kinds, and
the round's gradient from seeds and returns (`es_gradient`, `noise`, `centered_ranks`).

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass

import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import check_ranges

FLOW: Flow = "sync_rounds"
"""The flow: actors evaluate a round of perturbations of one weight round."""
MODEL_KINDS = ("mlp", "custom")
"""Network kinds: the policy's torso, on flat observations."""


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of OpenAI-ES."""

    sigma: float = 0.02
    """Standard deviation of the parameter noise."""
    population: int = 32
    """Antithetic perturbation PAIRS evaluated per round, split across the actors."""
    episodes_per_perturbation: int = 1
    """Episodes run (and averaged) per perturbation and sign."""
    weight_decay: float = 0.005
    """L2 coefficient added to the gradient: g += weight_decay * theta."""
    lr: float = 0.01
    """Learning rate."""
    max_staleness: int = 1_000_000
    """PS shards drop gradients computed against a version older than this many updates."""

    def __post_init__(self):
        # Written so that NaN fails every check.
        checks = {
            "sigma": (self.sigma > 0, "> 0"),
            "population": (self.population >= 1, ">= 1"),
            "episodes_per_perturbation": (self.episodes_per_perturbation >= 1, ">= 1"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            **lr_checks(self),
        }
        check_ranges("es", self, checks)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of all entries of `x` mapped to [-0.5, 0.5]: rank / (n - 1) - 0.5.

    As OpenAI's `compute_centered_ranks`, except for ties: tied entries get the mean of the
    ranks they span (OpenAI's argsort breaks ties by position, which gives two equal returns
    different utilities). Without ties the two agree exactly.

    Args:
        x: returns of any shape (all entries are ranked jointly).

    Returns:
        float32 array shaped like `x`; all zeros when `x` has a single entry.
    """
    x = np.asarray(x)
    flat = x.ravel()  # [n]
    n = flat.size
    if n <= 1:
        return np.zeros(x.shape, np.float32)
    order = np.argsort(flat, kind="stable")  # [n]
    ordered = flat[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]  # [n]
    group = np.cumsum(starts_group) - 1  # [n] group index of each sorted entry
    first = np.flatnonzero(starts_group)  # [G] first sorted position of each group
    last = np.r_[first[1:], n] - 1  # [G]
    ranks = np.empty(n, np.float64)
    ranks[order] = (0.5 * (first + last))[group]
    return (ranks / (n - 1) - 0.5).reshape(x.shape).astype(np.float32)


def noise(seed: int, size: int) -> np.ndarray:
    """The perturbation direction of `seed`: `size` standard normals, float32 `[size]`."""
    return np.random.default_rng(int(seed)).standard_normal(size).astype(np.float32)


def es_gradient(
    theta: np.ndarray,
    seeds: np.ndarray,
    returns_pos: np.ndarray,
    returns_neg: np.ndarray,
    sigma: float,
    weight_decay: float,
) -> np.ndarray:
    """The ES gradient of one round, to MINIMIZE (the PS does theta -= lr * opt(g)).

    g = -(1 / (n sigma)) sum_i (r+_i - r-_i) eps(seed_i) + weight_decay * theta,
    where r+/r- are the centered ranks of all 2n returns jointly.

    Args:
        theta: the flat parameters the round was run with, `[P]`.
        seeds: `[n]` perturbation seeds.
        returns_pos: `[n]` returns of theta + sigma * eps.
        returns_neg: `[n]` returns of theta - sigma * eps.
        sigma: noise standard deviation.
        weight_decay: L2 coefficient.

    Returns:
        float32 `[P]`.

    Raises:
        ValueError: no pairs, mismatched lengths, or a NaN return.
    """
    theta = np.asarray(theta, np.float32).reshape(-1)  # [P]
    seeds = np.asarray(seeds, np.int64).reshape(-1)  # [n]
    pos = np.asarray(returns_pos, np.float64).reshape(-1)  # [n]
    neg = np.asarray(returns_neg, np.float64).reshape(-1)  # [n]
    n = seeds.size
    if n == 0 or pos.size != n or neg.size != n:
        raise ValueError(
            f"need n >= 1 seeds and as many returns, got {n} seeds, {pos.size} and {neg.size}"
        )
    returns = np.stack([pos, neg])  # [2, n]
    if np.isnan(returns).any():
        raise ValueError("ES returns must not be NaN")
    ranks = centered_ranks(returns).astype(np.float64)  # [2, n]
    weights = ranks[0] - ranks[1]  # [n]
    total = np.zeros(theta.size, np.float64)  # [P]
    for seed, weight in zip(seeds, weights, strict=True):
        if weight != 0.0:
            total += weight * noise(seed, theta.size)
    grad = -total / (n * sigma) + weight_decay * theta.astype(np.float64)
    return grad.astype(np.float32)
