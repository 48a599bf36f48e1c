"""Discrete BCQ (Fujimoto et al. 2019, "Benchmarking Batch Deep Reinforcement Learning
Algorithms"): batch-constrained Q-learning from a recorded dataset.

DQN (double Q with a target network, dueling heads, n-step returns; `easyrl.algorithms.dqn`)
plus a behaviour-cloning classifier G(a|s) trained on the logged actions. Q's argmax, for the
targets and for acting, only considers the actions the data makes plausible:

    allowed(s) = {a : G(a|s) / max_a' G(a'|s) > threshold}
    a*(s)      = argmax_{a in allowed(s)} Q(s, a)

threshold = 0 allows every action (DQN); values near 1 leave only the most logged action
(behaviour cloning). Trains from `input.dir` only (OFFLINE_ONLY): the memory shards hold the
dataset's n-step transitions (`dataset_items`, the same as batch DQN's). Loss in `agent.BCQ`.
"""

from dataclasses import dataclass

import numpy as np

from easyrl.algorithms import dqn
from easyrl.algorithms.contract import PrioritizedAgent, ReplayKind
from easyrl.errors import check_ranges

FLOW = dqn.FLOW
"""Execution flow: the learner samples the memory shards (which hold the dataset)."""
REPLAY_KINDS: tuple[ReplayKind, ...] = ("uniform",)
"""The dataset's transitions, sampled uniformly (as every offline run samples them)."""
OFFLINE_ONLY = True
"""Trains from `input.dir` only: the config refuses a run without it."""
MODEL_KINDS = ("mlp", "conv", "custom")
"""Q and G are built from the same torsos as DQN's Q network."""


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


optimizer = dqn.optimizer
replay_spec = dqn.replay_spec
dataset_items = dqn.dataset_items


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of BCQ (imports TensorFlow; see `agent.BCQ`); every role builds
    the same networks, whatever `learner` says."""
    from easyrl.algorithms.bcq.agent import BCQ

    return BCQ(params, obs_space, action_space, model, seed)
