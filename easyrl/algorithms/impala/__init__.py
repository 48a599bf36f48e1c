"""IMPALA (Espeholt et al. 2018): actor-critic with V-trace off-policy correction.

Actors sample their (possibly stale) policy mu and ship unrolls of T steps of one env; learners
sample batches of unrolls from a FIFO trajectory table and compute gradients of the current
policy pi against V-trace targets. This package holds the hyper-parameters and the numpy side
(the replay columns, the runtime's hooks; `params`: what `agent.py` imports too);
`agent.IMPALA` holds the TensorFlow side and is imported lazily by `build`.

V-trace (time-major, V(x_T) = bootstrap value, vs_T = bootstrap value):
    rho_t   = pi(a_t|x_t) / mu(a_t|x_t)
    delta_t = min(rho_bar, rho_t) * (r_t + discount_t * V(x_{t+1}) - V(x_t))
    c_t     = lam * min(c_bar, rho_t)
    vs_t    = V(x_t) + delta_t + discount_t * c_t * (vs_{t+1} - V(x_{t+1}))
    pg_advantage_t = min(rho_bar, rho_t) * (r_t + discount_t * vs_{t+1} - V(x_t))

Episode ends: `discount_t = gamma * (1 - done_t)` with `done = terminated | truncated`, so a
truncated episode end is treated as terminal: nothing is bootstrapped across an episode end,
neither from the reset observation nor from the final one (the common IMPALA practice; the
unroll stores no final observation). Unrolls continue episodes across unroll boundaries.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym

from easyrl.algorithms.contract import AlgorithmSpec, ReplayAgent
from easyrl.algorithms.impala import params
from easyrl.algorithms.impala.params import AgentParams, check_spaces, unroll_spec
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import ConfigError, check_ranges

__all__ = [
    "AgentParams",
    "Params",
    "SPEC",
    "agent_params",
    "build",
    "check_spaces",
    "optimizer",
    "replay_spec",
    "shared_checks",
    "unroll_spec",
]

if TYPE_CHECKING:
    from easyrl.algorithms import a3c


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of IMPALA (V-trace actor-critic on a FIFO of unrolls)."""

    unroll_length: int = 20
    """T: env steps per unroll (each unroll also stores the bootstrap observation x_T)."""
    batch_size: int = 32
    """Unrolls per learner batch."""
    gamma: float = 0.99
    """Discount factor."""
    rho_bar: float = 1.0
    """V-trace clip of the importance weights in the TD errors and the policy gradient."""
    c_bar: float = 1.0
    """V-trace clip of the trace-cutting coefficients c_t."""
    lam: float = 1.0
    """V-trace lambda: c_t = lam * min(c_bar, rho_t) (1: the paper's V-trace)."""
    baseline_cost: float = 0.5
    """Weight of the baseline (value) loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    lr: float = 6e-4
    """(Initial) learning rate."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    max_staleness: int = 1000
    """PS shards drop gradients computed against a version older than this many updates."""

    def __post_init__(self):
        # (holds, valid range); written so that NaN fails every check.
        checks = {
            "unroll_length": (self.unroll_length >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "rho_bar": (self.rho_bar > 0.0, "> 0"),
            "c_bar": (self.c_bar > 0.0, "> 0"),
            "lam": (0.0 <= self.lam <= 1.0, "in [0, 1]"),
            **shared_checks(self),
        }
        check_ranges("impala", self, checks)


def shared_checks(params) -> dict[str, tuple[bool, str]]:
    """Checks of the fields IMPALA and A3C share: {field: (holds, valid range)}."""
    return {
        "baseline_cost": (params.baseline_cost >= 0.0, ">= 0"),
        "entropy_cost": (params.entropy_cost >= 0.0, ">= 0"),
        **lr_checks(params),
        "grad_clip": (params.grad_clip >= 0.0, ">= 0"),
        "max_staleness": (params.max_staleness >= 0, ">= 0"),
    }


def agent_params(params: Params) -> AgentParams:
    """IMPALA's `Params` as the agent's settings."""
    return AgentParams(
        name="impala",
        flow=SPEC.flow,
        unroll_length=params.unroll_length,
        gamma=params.gamma,
        rho_bar=params.rho_bar,
        c_bar=params.c_bar,
        lam=params.lam,
        baseline_cost=params.baseline_cost,
        entropy_cost=params.entropy_cost,
        grad_clip=params.grad_clip,
    )


def optimizer(params: "Params | a3c.Params"):
    """The optimizer the PS shards apply this algorithm's gradients with (`optimizer`, `lr` and
    its schedule; EasyRL's Pong: lr_schedule linear, 6e-4 to 0 over 100k updates). Shared by
    A3C."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


def replay_spec(params: Params, obs_space, action_space, lstm: int = 0) -> dict:
    """Columns of one replay item, one unroll of one env (see `unroll_spec`; `lstm` is
    `model.lstm`).

    Raises:
        ConfigError: the action space is not Discrete.
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"impala needs a Discrete action space, got {action_space}")
    return unroll_spec(params.unroll_length, obs_space, action_space, lstm)


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> ReplayAgent:
    """Builds the TF side of IMPALA (imports TensorFlow; see `agent.IMPALA`); every role
    builds the same network, whatever `learner` says.

    Raises:
        ConfigError: unsupported spaces or model kind (see `check_spaces`).
    """
    check_spaces(obs_space, action_space, model)
    from easyrl.algorithms.impala.agent import IMPALA

    return IMPALA(agent_params(params), obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("trajectory",),  # a FIFO table of whole unrolls
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=("mlp", "conv", "custom", "encoders"),
    recurrence="optional",  # an LSTM core between the torso and the heads (`agent.LSTMCore`)
    action_masks=True,  # no illegal action is acted, explored or bootstrapped from
    multiagent=True,
    fused_update=True,  # `agent.fuse_update`: a lone learner's update in one call
)
"""IMPALA, as the runtime knows it."""
