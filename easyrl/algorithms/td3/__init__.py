"""TD3 (Fujimoto et al. 2018) and, with its options off, DDPG / Ape-X DDPG: deterministic
actor-critic for bounded Box actions, n-step returns, uniform or prioritized replay.

This package holds the hyper-parameters and the numpy side (`params`: what `agent.py` imports
too; exploration scales, replay columns;
the space checks and action scaling it shares with SAC are in `easyrl.algorithms.continuous`);
`agent.TD3` holds the TensorFlow side and is imported lazily by `build`. Actions live in the
normalized cube [-1, 1]^A everywhere inside the algorithm (the actor's tanh output, the replay,
the critics); only the env sees them scaled to its bounds:
    env_action = low + (a + 1) / 2 * (high - low).

Losses (discount = gamma^m, 0 at termination; w = importance weights):
    a'  = clip(mu'(s') + clip(sigma * eps, -c, c), -1, 1),  eps ~ N(0, 1)   (smoothing)
    y   = R + discount * min_i Q'_i(s', a')       (min over the twins when twin_q)
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    actor_loss  = -mean(Q_1(s, mu(s)))            (every `policy_delay`-th learn call)
"""

import numpy as np

from easyrl.algorithms import continuous
from easyrl.algorithms.continuous import check_spaces
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.td3 import params
from easyrl.algorithms.td3.params import Params, actor_noise_scale, check_params

__all__ = [
    "Params",
    "SPEC",
    "actor_noise_scale",
    "build",
    "check_params",
    "optimizer",
    "replay_spec",
]


def optimizer(params: Params) -> dict:
    """The PS optimizer groups: `actor/` at `actor_lr`, `critic/` at `critic_lr` (None: `lr`),
    both on the `lr_schedule`."""
    from easyrl.algorithms.optimizers import schedule_spec

    return {
        "actor/": schedule_spec(params, params.actor_lr),
        "critic/": schedule_spec(params, params.critic_lr),
    }


def replay_spec(params: object, obs_space, action_space, name: str = "td3") -> dict:
    """Columns of one n-step transition, as {name: (per-item shape, dtype)}: the action is
    the normalized float32 action in [-1, 1]^A, observations are float32. `name` prefixes the
    error messages. `params` is not read (the columns follow from the spaces): DDPG and SAC
    pass their own.

    Raises:
        ConfigError: unsupported spaces (see `check_spaces`).
    """
    check_spaces(name, obs_space, action_space)
    obs = (tuple(obs_space.shape), np.dtype(np.float32))
    scalar = ((), np.dtype(np.float32))
    return {
        "obs": obs,
        "action": (tuple(action_space.shape), np.dtype(np.float32)),
        "reward": scalar,
        "next_obs": obs,
        "discount": scalar,
    }


def build(
    params: Params,
    obs_space,
    action_space,
    model,
    seed: int = 0,
    learner: bool = False,
    name: str = "td3",
) -> PrioritizedAgent:
    """Builds the TF side of TD3 (imports TensorFlow; see `agent.TD3`); every role builds the
    same networks, whatever `learner` says. `name` prefixes the error messages.

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, or the spaces are unsupported.
    """
    from easyrl.algorithms.td3.agent import TD3

    return TD3(params, obs_space, action_space, model, seed, name=name)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("uniform", "prioritized"),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=continuous.MODEL_KINDS,  # an MLP or a custom torso
)
"""TD3, as the runtime knows it (DDPG's too, with its own `Params` and names)."""
