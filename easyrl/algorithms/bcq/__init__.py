"""Discrete BCQ (Fujimoto et al. 2019, "Benchmarking Batch Deep Reinforcement Learning
Algorithms"): batch-constrained Q-learning from a recorded dataset.

DQN (double Q with a target network, dueling heads, n-step returns; `easyrl.algorithms.dqn`)
plus a behaviour-cloning classifier G(a|s) trained on the logged actions. Q's argmax, for the
targets and for acting, only considers the actions the data makes plausible:

    allowed(s) = {a : G(a|s) / max_a' G(a'|s) > threshold}
    a*(s)      = argmax_{a in allowed(s)} Q(s, a)

threshold = 0 allows every action (DQN); values near 1 leave only the most logged action
(behaviour cloning). Trains from `input.dir` only (`offline_only`): the memory shards hold the
dataset's n-step transitions (`dataset_items`, the same as batch DQN's). Loss in `agent.BCQ`.
"""

from dataclasses import dataclass

import numpy as np

from easyrl.algorithms import dqn
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
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


SPEC = AlgorithmSpec(
    flow="async_replay",  # the learner samples the memory shards (which hold the dataset)
    replay_kinds=("uniform",),  # as every offline run samples its dataset
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    dataset_items=dataset_items,  # the same n-step transitions as batch DQN's
    model_kinds=("mlp", "conv", "custom"),  # Q and G: the torsos of DQN's Q network
    offline_only=True,
)
"""Discrete BCQ, as the runtime knows it."""
