"""TD3's numpy side that `agent.py` needs too: the hyper-parameters (and their checks, shared with
DDPG), its flow and the actors' exploration scales.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass
from typing import Literal

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, group_rate_checks
from easyrl.errors import check_ranges

FLOW: Flow = "async_replay"
"""The flow: actors ship transitions, learners sample them asynchronously."""


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of TD3 (and of DDPG, which is TD3 with its three tricks off); the
    optimizer and learning-rate keys are `LearningRate`'s, for both groups."""

    lr: float = 1e-3
    """Learning rate of both groups (the initial one under a step or linear schedule)."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Length of the n-step return computed on the actor."""
    batch_size: int = 256
    """Transitions per learner batch."""
    actor_lr: float | None = None
    """The actor's own initial learning rate (`actor/` variables; None: `lr`)."""
    critic_lr: float | None = None
    """The critics' own initial learning rate (`critic/` variables; None: `lr`)."""
    tau: float = 0.005
    """Polyak rate of the target networks: target = tau * online + (1 - tau) * target."""
    twin_q: bool = True
    """Two critics; the target takes the smaller of their two estimates (clipped double Q)."""
    policy_delay: int = 2
    """The actor gets gradients on every `policy_delay`-th learn call (calls d, 2d, ...)."""
    target_noise: float = 0.2
    """Std of the target policy smoothing noise, in normalized action units (0 disables)."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to +-this, in normalized action units."""
    exploration: Literal["gaussian", "ou"] = "gaussian"
    """Exploration noise of the actors: independent Gaussian or Ornstein-Uhlenbeck."""
    exploration_noise: float = 0.1
    """Std of the exploration noise (OU: of its per-step innovation), normalized units."""
    noise_alpha: float = 0.0
    """Ape-X spread: actor i of N explores with exploration_noise * (1 + noise_alpha) **
    (i / (N - 1)), a geometric ladder from the base scale up to (1 + noise_alpha) times it."""
    ou_theta: float = 0.15
    """OU mean reversion per env step: x <- (1 - theta) * x + sigma * N(0, 1)."""
    random_steps: int = 0
    """Env steps (per actor) of uniform random actions before the policy takes over."""
    grad_clip: float = 0.0
    """Global-norm gradient clip, applied to the actor and critic groups separately (0
    disables)."""
    max_staleness: int = 1000
    """PS shards drop gradients computed against a version older than this many updates."""

    def __post_init__(self):
        check_params("td3", self)


def check_params(name: str, params) -> None:
    """Checks the ranges of TD3-shaped hyper-parameters (TD3's or DDPG's `Params`).

    Args:
        name: the algorithm name the error messages start with ("td3", "ddpg").
        params: the hyper-parameters.

    Raises:
        ConfigError: "<name>: <field> must be <range>, got <value>" for the first bad field.
    """
    p = params
    # (holds, valid range); written so that NaN fails every check.
    checks = {
        **group_rate_checks(p, ("actor_lr", "critic_lr")),
        "gamma": (0.0 <= p.gamma <= 1.0, "in [0, 1]"),
        "n_step": (p.n_step >= 1, ">= 1"),
        "batch_size": (p.batch_size >= 1, ">= 1"),
        "tau": (0.0 < p.tau <= 1.0, "in (0, 1]"),
        "twin_q": (isinstance(p.twin_q, bool), "a bool"),
        "policy_delay": (p.policy_delay >= 1, ">= 1"),
        "target_noise": (p.target_noise >= 0.0, ">= 0"),
        "target_noise_clip": (p.target_noise_clip >= 0.0, ">= 0"),
        "exploration": (p.exploration in ("gaussian", "ou"), "gaussian or ou"),
        "exploration_noise": (p.exploration_noise >= 0.0, ">= 0"),
        "noise_alpha": (p.noise_alpha >= 0.0, ">= 0"),
        "ou_theta": (0.0 < p.ou_theta <= 1.0, "in (0, 1]"),
        "random_steps": (p.random_steps >= 0, ">= 0"),
        "grad_clip": (p.grad_clip >= 0.0, ">= 0"),
        "max_staleness": (p.max_staleness >= 0, ">= 0"),
    }
    check_ranges(name, p, checks)


def actor_noise_scale(params: Params, actor_index: int, num_actors: int) -> float:
    """Ape-X exploration ladder: sigma_i = sigma * (1 + alpha) ** (i / (N - 1)), so actor 0
    uses `exploration_noise` and actor N - 1 uses `exploration_noise * (1 + noise_alpha)`;
    a single actor uses the base scale."""
    if num_actors <= 1:
        return float(params.exploration_noise)
    return float(
        params.exploration_noise * (1.0 + params.noise_alpha) ** (actor_index / (num_actors - 1))
    )
