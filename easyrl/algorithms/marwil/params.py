"""MARWIL's numpy side that `agent.py` needs too: the hyper-parameters (and their checks, shared
with BC) and its flow.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass

import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import check_ranges

FLOW: Flow = "async_replay"
"""The flow: the learner samples the memory shards (which hold the dataset)."""


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of MARWIL."""

    beta: float = 1.0
    """Advantage weighting exponent (0: behaviour cloning)."""
    vf_coeff: float = 1.0
    """Weight of the value loss (unused when beta = 0: no value head is trained)."""
    gamma: float = 0.99
    """Discount of the returns-to-go."""
    batch_size: int = 256
    """Steps per learner batch."""
    adv_norm_start: float = 100.0
    """Initial moving average of the squared advantage norm (RLlib's default)."""
    adv_norm_update_rate: float = 1e-8
    """Rate of the moving average of the squared advantage norm (RLlib's default)."""
    lr: float = 1e-3
    """Learning rate."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    max_staleness: int = 20
    """PS shards drop gradients computed against a version older than this many updates."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions only)."""

    def __post_init__(self):
        check_params("marwil", self)


def check_params(name: str, p: Params) -> None:
    """Raises ConfigError naming the first out-of-range value of `p` (NaN fails every
    check)."""
    checks = {
        "beta": (p.beta >= 0.0, ">= 0"),
        "vf_coeff": (p.vf_coeff >= 0.0, ">= 0"),
        "gamma": (0.0 <= p.gamma <= 1.0, "in [0, 1]"),
        "batch_size": (p.batch_size >= 1, ">= 1"),
        "adv_norm_start": (p.adv_norm_start > 0.0, "> 0"),
        "adv_norm_update_rate": (0.0 <= p.adv_norm_update_rate <= 1.0, "in [0, 1]"),
        **lr_checks(p),
        "grad_clip": (p.grad_clip >= 0.0, ">= 0"),
        "max_staleness": (p.max_staleness >= 0, ">= 0"),
        "log_std_init": (bool(np.isfinite(p.log_std_init)), "finite"),
    }
    check_ranges(name, p, checks)
