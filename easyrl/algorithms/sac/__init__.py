"""SAC (Haarnoja et al. 2018, with the learned temperature of the second paper): a
squashed-Gaussian policy, twin critics with Polyak targets, n-step returns, uniform or
prioritized replay, for bounded Box actions.

This package holds the hyper-parameters (`params`, which `agent.py` imports too) and the
runtime's hooks; `agent.SAC` holds the TensorFlow side and is imported lazily by `build`.
Actions are normalized to [-1, 1]^A inside the algorithm and scaled to the Box bounds for the
env only (as in TD3; see `easyrl.algorithms.continuous.scale_actions`).

Losses (alpha = exp(log_alpha), a ~ pi(.|s) reparameterized, discount = gamma^m or 0):
    y           = R + discount * (min_i Q'_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    actor_loss  = mean(alpha * log pi(a|s) - min_i Q_i(s, a))
    alpha_loss  = -mean(log_alpha * (log pi(a|s) + target_entropy))
"""

from easyrl.algorithms import td3
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.sac import params
from easyrl.algorithms.sac.params import Params

__all__ = ["Params", "SPEC", "build", "optimizer", "replay_spec"]


def optimizer(params: Params) -> dict:
    """The PS optimizer groups: `actor/`, `critic/` and `alpha/`, each at its own rate (None:
    `lr`), all on the `lr_schedule`."""
    from easyrl.algorithms.optimizers import schedule_spec

    return {
        "actor/": schedule_spec(params, params.actor_lr),
        "critic/": schedule_spec(params, params.critic_lr),
        "alpha/": schedule_spec(params, params.alpha_lr),
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
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("uniform", "prioritized"),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=td3.SPEC.model_kinds,  # TD3's torsos (the same numpy side)
    fused_update=True,  # `agent.fuse_update`: a lone learner's update in one call
)
"""SAC, as the runtime knows it."""
