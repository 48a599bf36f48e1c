"""SAC (Haarnoja et al. 2018, with the learned temperature of the second paper): a
squashed-Gaussian policy, twin critics with Polyak targets, n-step returns, uniform or
prioritized replay, for bounded Box actions.

This module holds the hyper-parameters and the runtime's hooks; `agent.SAC` holds the
TensorFlow side and is imported lazily by `build`. Actions are normalized to [-1, 1]^A inside
the algorithm and scaled to the Box bounds for the env only (as in TD3; see
`easyrl.algorithms.continuous.scale_actions`).

Losses (alpha = exp(log_alpha), a ~ pi(.|s) reparameterized, discount = gamma^m or 0):
    y           = R + discount * (min_i Q'_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    actor_loss  = mean(alpha * log pi(a|s) - min_i Q_i(s, a))
    alpha_loss  = -mean(log_alpha * (log pi(a|s) + target_entropy))
"""

from dataclasses import dataclass
from typing import Literal

from easyrl.algorithms import td3
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.learning_rate import positive_rate
from easyrl.errors import check_ranges


@dataclass(frozen=True)
class Params:
    """Hyper-parameters of SAC."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Length of the n-step return computed on the actor."""
    batch_size: int = 256
    """Transitions per learner batch."""
    actor_lr: float = 3e-4
    """Learning rate of the policy (`actor/` variables)."""
    critic_lr: float = 3e-4
    """Learning rate of the twin critics (`critic/` variables)."""
    alpha_lr: float = 3e-4
    """Learning rate of the temperature (`alpha/log_alpha`)."""
    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    """Optimizer the PS shards apply gradients with (all three groups)."""
    tau: float = 0.005
    """Polyak rate of the target critics: target = tau * online + (1 - tau) * target."""
    initial_alpha: float = 1.0
    """Initial entropy temperature alpha (log_alpha starts at its log)."""
    autotune_alpha: bool = True
    """Learn alpha so that the policy entropy tracks `target_entropy` (off: alpha stays)."""
    target_entropy: float | None = None
    """Entropy the temperature steers the policy to (None: -|A|, the action dimension)."""
    random_steps: int = 0
    """Env steps (per actor) of uniform random actions before the policy takes over."""
    grad_clip: float = 0.0
    """Global-norm gradient clip, applied to the actor and critic groups separately (0
    disables)."""
    max_staleness: int = 1000
    """PS shards drop gradients computed against a version older than this many updates."""

    def __post_init__(self):
        # (holds, valid range); written so that NaN fails every check.
        checks = {
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "n_step": (self.n_step >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "actor_lr": (positive_rate(self.actor_lr), "finite and > 0"),
            "critic_lr": (positive_rate(self.critic_lr), "finite and > 0"),
            "alpha_lr": (positive_rate(self.alpha_lr), "finite and > 0"),
            "optimizer": (self.optimizer in ("adam", "rmsprop", "sgd"), "adam, rmsprop or sgd"),
            "tau": (0.0 < self.tau <= 1.0, "in (0, 1]"),
            "initial_alpha": (0.0 < self.initial_alpha < float("inf"), "> 0 and finite"),
            "autotune_alpha": (isinstance(self.autotune_alpha, bool), "a bool"),
            "target_entropy": (
                self.target_entropy is None or abs(self.target_entropy) < float("inf"),
                "finite or None",
            ),
            "random_steps": (self.random_steps >= 0, ">= 0"),
            "grad_clip": (self.grad_clip >= 0.0, ">= 0"),
            "max_staleness": (self.max_staleness >= 0, ">= 0"),
        }
        check_ranges("sac", self, checks)


def optimizer(params: Params) -> dict:
    """The PS optimizer groups: `actor/`, `critic/` and `alpha/`, each at its own rate."""
    from easyrl.algorithms.optimizers import OptimizerSpec

    return {
        "actor/": OptimizerSpec(kind=params.optimizer, lr=params.actor_lr),
        "critic/": OptimizerSpec(kind=params.optimizer, lr=params.critic_lr),
        "alpha/": OptimizerSpec(kind=params.optimizer, lr=params.alpha_lr),
    }


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one n-step transition: float32 observations, the action normalized to
    [-1, 1]^A, reward and discount (TD3's columns).

    Raises:
        ConfigError: unsupported spaces (a flat Box observation and a flat bounded Box
            action are needed).
    """
    return td3.replay_spec(params, obs_space, action_space, name="sac")


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of SAC (imports TensorFlow; see `agent.SAC`); every role builds the
    same networks, whatever `learner` says.

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, or the spaces are unsupported.
    """
    from easyrl.algorithms.sac.agent import SAC

    return SAC(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow="async_replay",  # actors ship transitions, learners sample them asynchronously
    replay_kinds=("uniform", "prioritized"),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=td3.SPEC.model_kinds,  # TD3's torsos (the same numpy side)
)
"""SAC, as the runtime knows it."""
