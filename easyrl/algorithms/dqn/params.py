"""DQN's numpy side that `agent.py` needs too: the hyper-parameters (`ApexParams`, shared with R2D2,
and `Params`), its flow and Ape-X's per-actor exploration rate.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import check_ranges

FLOW: Flow = "async_replay"
"""The flow: actors ship transitions, learners sample them asynchronously."""


@dataclass(frozen=True)
class ApexParams(LearningRate):
    """The hyper-parameters DQN and R2D2 share: the PS optimizer, the target network and
    Ape-X's per-actor exploration. Their `Params` add their own keys and re-default some."""

    ALGORITHM: ClassVar[str] = "dqn"

    lr: float = 1e-3
    """Learning rate."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    double_q: bool = True
    """Select next actions with the online network, evaluate with the target network."""
    dueling: bool = True
    """Dueling value/advantage heads."""
    target_update_period: int = 200
    """Learner updates between target-network syncs."""
    max_staleness: int = 20
    """PS shards drop gradients computed against a version older than this many updates."""
    epsilon: float = 0.4
    """Ape-X base rate: actor i of N explores with epsilon ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Ape-X exploration exponent."""
    epsilon_start: float = 1.0
    """Initial exploration rate, annealed linearly to the actor's own rate."""
    epsilon_anneal_steps: int = 0
    """Env steps (per actor) over which epsilon is annealed; 0 means no annealing."""

    def __post_init__(self):
        check_ranges(self.ALGORITHM, self, self.checks())

    def checks(self) -> dict[str, tuple[bool, str]]:
        """{field: (holds, valid range)}, written so that NaN fails every check."""
        return {
            **lr_checks(self),
            "grad_clip": (self.grad_clip >= 0.0, ">= 0"),
            "target_update_period": (self.target_update_period >= 1, ">= 1"),
            "max_staleness": (self.max_staleness >= 0, ">= 0"),
            "epsilon": (0.0 <= self.epsilon <= 1.0, "in [0, 1]"),
            "epsilon_alpha": (self.epsilon_alpha >= 0.0, ">= 0"),
            "epsilon_start": (0.0 <= self.epsilon_start <= 1.0, "in [0, 1]"),
            "epsilon_anneal_steps": (self.epsilon_anneal_steps >= 0, ">= 0"),
        }


@dataclass(frozen=True)
class Params(ApexParams):
    """Hyper-parameters of DQN / Ape-X DQN (the optimizer, target and exploration keys:
    `ApexParams`)."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Length of the n-step return computed on the actor."""
    batch_size: int = 64
    """Transitions per learner batch."""
    huber_delta: float = 1.0
    """Huber loss threshold."""
    num_atoms: int = 1
    """1: Q values (DQN); >= 2: C51, a distribution of the return over this many atoms
    evenly spaced on [v_min, v_max], learned by cross-entropy to the projected n-step target
    (which is also the new priority)."""
    v_min: float = -10.0
    """Lowest atom of the C51 support (used when num_atoms >= 2)."""
    v_max: float = 10.0
    """Highest atom of the C51 support (used when num_atoms >= 2)."""
    noisy_sigma: float = 0.0
    """> 0: NoisyNet heads (factorized Gaussian noise, sigma initialized to this / sqrt(fan
    in), fresh noise every network call) that explore by themselves: set epsilon to 0.
    Greedy evaluation and exported policies use the noise-free means."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        """{field: (holds, valid range)}, written so that NaN fails every check."""
        return {
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "n_step": (self.n_step >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "huber_delta": (self.huber_delta > 0.0, "> 0"),
            **super().checks(),
            "num_atoms": (self.num_atoms >= 1, ">= 1"),
            "v_min": (bool(np.isfinite(self.v_min)), "finite"),
            "v_max": (self.v_max > self.v_min and bool(np.isfinite(self.v_max)), "> v_min"),
            "noisy_sigma": (0.0 <= self.noisy_sigma < float("inf"), "finite and >= 0"),
        }


def actor_epsilon(params: ApexParams, actor_index: int, num_actors: int, env_steps: int) -> float:
    """Ape-X exploration: eps_i = eps ** (1 + alpha * i / (N - 1)), annealed from
    `epsilon_start` over the actor's first `epsilon_anneal_steps` env steps (DQN's and
    R2D2's)."""
    final = params.epsilon
    if num_actors > 1:
        final = params.epsilon ** (1 + params.epsilon_alpha * actor_index / (num_actors - 1))
    if params.epsilon_anneal_steps <= 0 or env_steps >= params.epsilon_anneal_steps:
        return final
    frac = env_steps / params.epsilon_anneal_steps
    return params.epsilon_start + frac * (final - params.epsilon_start)
