"""SAC's numpy side that `agent.py` needs too: the hyper-parameters and its flow.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, group_rate_checks
from easyrl.errors import check_ranges

FLOW: Flow = "async_replay"
"""The flow: actors ship transitions, learners sample them asynchronously."""


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of SAC; the optimizer and learning-rate keys are `LearningRate`'s, for
    all three groups."""

    lr: float = 3e-4
    """Learning rate of every group (the initial one under a step or linear schedule)."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Length of the n-step return computed on the actor."""
    batch_size: int = 256
    """Transitions per learner batch."""
    actor_lr: float | None = None
    """The policy's own initial learning rate (`actor/` variables; None: `lr`)."""
    critic_lr: float | None = None
    """The twin critics' own initial learning rate (`critic/` variables; None: `lr`)."""
    alpha_lr: float | None = None
    """The temperature's own initial learning rate (`alpha/log_alpha`; None: `lr`)."""
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
            **group_rate_checks(self, ("actor_lr", "critic_lr", "alpha_lr")),
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "n_step": (self.n_step >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
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
