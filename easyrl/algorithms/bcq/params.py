"""BCQ's numpy side that `agent.py` needs too: the hyper-parameters.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass

import numpy as np

from easyrl.algorithms import dqn
from easyrl.errors import check_ranges


@dataclass(frozen=True)
class Params(dqn.Params):
    """Hyper-parameters of discrete BCQ: DQN's (the `epsilon*` exploration ones are unused:
    there are no actors; `n_step` returns are computed from the dataset's episodes), and the
    action constraint and the classifier's loss weights."""

    threshold: float = 0.3
    """tau: Q's argmax considers actions with G(a|s) / max_a' G(a'|s) > tau (0: DQN)."""
    bc_weight: float = 1.0
    """Weight of the classifier's cross-entropy loss on the logged actions."""
    logit_reg: float = 0.01
    """Weight of the classifier's logit regularization mean(logits^2)."""

    def __post_init__(self):
        super().__post_init__()  # DQN's fields
        # Written so that NaN fails every check.
        checks = {
            "threshold": (0.0 <= self.threshold < 1.0, "in [0, 1)"),
            "bc_weight": (self.bc_weight >= 0.0 and bool(np.isfinite(self.bc_weight)), ">= 0"),
            "logit_reg": (self.logit_reg >= 0.0 and bool(np.isfinite(self.logit_reg)), ">= 0"),
            # DQN's Rainbow switches: BCQ's constraint acts on Q values, with no noise
            "num_atoms": (self.num_atoms == 1, "1 (no C51 in BCQ)"),
            "noisy_sigma": (self.noisy_sigma == 0.0, "0 (no noisy heads in BCQ)"),
        }
        check_ranges("bcq", self, checks)
