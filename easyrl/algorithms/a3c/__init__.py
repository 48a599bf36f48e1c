"""A3C (Mnih et al. 2016): asynchronous advantage actor-critic, gradients computed on actors.

Flow "actor_gradients": only ps and actor roles. Each actor collects unrolls of n steps with
the weights it last pulled, computes the gradients on them at those very weights and pushes
them to the PS directly (no replay, no learner).

The agent is `easyrl.algorithms.impala.agent.IMPALA` with rho_bar = c_bar = lam = 1. The data
is on-policy (the behaviour logits come from the weights the gradient is computed at), so
rho_t = 1 and the V-trace targets are exactly the n-step bootstrapped returns
    vs_t = sum_{k=t}^{T-1} (prod_{i=t}^{k-1} discount_i) r_k + (prod_{i=t}^{T-1} discount_i) V(x_T)
and the policy-gradient advantage is r_t + discount_t * vs_{t+1} - V(x_t) = vs_t - V(x_t):
A3C's advantage actor-critic loss. Episode ends are handled as in IMPALA: discount_t =
gamma * (1 - done_t), a truncated episode end is treated as terminal.
"""

from dataclasses import dataclass

import gymnasium as gym

from easyrl.algorithms import impala
from easyrl.algorithms.contract import AlgorithmSpec, GradientsAgent
from easyrl.algorithms.learning_rate import LearningRate
from easyrl.errors import ConfigError, check_ranges


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of A3C (n-step advantage actor-critic, gradients on the actors)."""

    unroll_length: int = 20
    """n: env steps per unroll, the horizon of the n-step bootstrapped returns."""
    gamma: float = 0.99
    """Discount factor."""
    baseline_cost: float = 0.5
    """Weight of the baseline (value) loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    lr: float = 1e-3
    """(Initial) learning rate."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    max_staleness: int = 1000
    """PS shards drop gradients computed against a version older than this many updates."""

    def __post_init__(self):
        # (holds, valid range); written so that NaN fails every check.
        checks = {
            "unroll_length": (self.unroll_length >= 1, ">= 1"),
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            **impala.shared_checks(self),
        }
        check_ranges("a3c", self, checks)


def agent_params(params: Params) -> impala.AgentParams:
    """A3C's `Params` as the agent's settings: V-trace with rho_bar = c_bar = lam = 1."""
    return impala.AgentParams(
        name="a3c",
        flow=SPEC.flow,
        unroll_length=params.unroll_length,
        gamma=params.gamma,
        rho_bar=1.0,
        c_bar=1.0,
        lam=1.0,
        baseline_cost=params.baseline_cost,
        entropy_cost=params.entropy_cost,
        grad_clip=params.grad_clip,
    )


def optimizer(params: Params):
    """The optimizer the PS shards apply the actors' gradients with (`optimizer`, `lr` and its
    schedule; see `impala.optimizer`)."""
    return impala.optimizer(params)


def replay_spec(params: Params, obs_space, action_space, lstm: int = 0) -> dict:
    """Columns of one unroll of one env, as IMPALA's (see `impala.unroll_spec`; `lstm` is
    `model.lstm`): the actor builds the same unroll dicts and computes its gradients on them.

    Raises:
        ConfigError: the action space is not Discrete.
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"a3c needs a Discrete action space, got {action_space}")
    return impala.unroll_spec(params.unroll_length, obs_space, action_space, lstm)


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> GradientsAgent:
    """Builds the TF side of A3C: an `impala.agent.IMPALA` with rho_bar = c_bar = lam = 1
    (imports TensorFlow). Every role builds the same network, whatever `learner` says.

    Raises:
        ConfigError: unsupported spaces or model kind (see `impala.check_spaces`).
    """
    impala.check_spaces(obs_space, action_space, model, "a3c")
    from easyrl.algorithms.impala.agent import IMPALA

    return IMPALA(agent_params(params), obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow="actor_gradients",  # ps and actors only; actors push gradients of their own unrolls
    replay_kinds=(),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=impala.SPEC.model_kinds,  # IMPALA's agent, so its networks and capabilities
    recurrence=impala.SPEC.recurrence,
    action_masks=impala.SPEC.action_masks,
)
"""A3C, as the runtime knows it."""
