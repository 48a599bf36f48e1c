"""MARWIL (Wang et al. 2018, "Exponentially Weighted Imitation Learning for Batched
Historical Data"): imitation of logged actions weighted by exp(beta * advantage); beta = 0 is
behaviour cloning (`easyrl.algorithms.bc`).

Trains from a recorded dataset only (`input.dir`; `offline_only`: no actors, no collector).
Items are single steps with their discounted return-to-go, computed per episode from the
dataset's rows (`dataset_items`):

    R_t = r_t + gamma * R_{t+1},   R_T = 0 after the episode's last step

Truncated episodes are not bootstrapped (no value function exists when the dataset is
loaded): their last steps' returns are underestimated, as in RLlib's MARWIL. Loss on a
batch (`agent.MARWIL`), with c the moving average of the squared advantage norm:

    A            = R - V(s)
    policy_loss  = -mean(stop_gradient(exp(beta * A / sqrt(c))) * log pi(a | s))
    value_loss   = 0.5 * mean(A^2)
    loss         = policy_loss + vf_coeff * value_loss        (beta = 0: policy_loss only,
                                                               -mean(log pi(a | s)))
    c           <- c + adv_norm_update_rate * (mean(A^2) - c)  (after each batch)
"""

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, ReplayLearner
from easyrl.algorithms.marwil import params
from easyrl.algorithms.marwil.params import Params, check_params
from easyrl.algorithms.registry import check_model_kind
from easyrl.errors import ConfigError
from easyrl.offline.dataset import episode_bounds

__all__ = [
    "Params",
    "SPEC",
    "build",
    "check_params",
    "check_spaces",
    "dataset_items",
    "optimizer",
    "replay_spec",
    "returns_to_go",
]


def optimizer(params: Params):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


def check_spaces(obs_space, action_space, name: str = "marwil") -> None:
    """Raises ConfigError unless the observation is a flat Box and the action space is
    Discrete or a flat Box."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"{name} needs a flat Box observation, got {obs_space}")
    if isinstance(action_space, gym.spaces.Discrete):
        return
    if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
        raise ConfigError(f"{name} needs a Discrete or a flat Box action space, got {action_space}")


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one item (a logged step), as {name: (per-item shape, dtype)}.

    Raises:
        ConfigError: unsupported spaces.
    """
    check_spaces(obs_space, action_space)
    if isinstance(action_space, gym.spaces.Discrete):
        action = ((), np.dtype(np.int64))
    else:
        action = (tuple(action_space.shape), np.dtype(np.float32))
    return {
        "obs": (tuple(obs_space.shape), np.dtype(np.float32)),
        "action": action,
        "return": ((), np.dtype(np.float32)),
    }


def returns_to_go(rewards: np.ndarray, bounds: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted returns-to-go `[rows]` float32 of the episodes `bounds[j]:bounds[j + 1]`
    (see the module docstring; accumulated in float64)."""
    out = np.zeros(len(rewards), np.float64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        g = 0.0
        for i in range(hi - 1, lo - 1, -1):
            g = float(rewards[i]) + gamma * g
            out[i] = g
    return out.astype(np.float32)


def dataset_items(params: Params, steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Items (obs, action, return-to-go) of the rows of `read_steps` (whole episodes,
    sorted by episode and t).

    Raises:
        DatasetError: the rows are not whole episodes.
    """
    bounds = episode_bounds(steps)
    action = steps["action"]
    action = action.astype(np.int64 if action.dtype.kind in "iu" else np.float32)
    return {
        "obs": steps["obs"].astype(np.float32),
        "action": action,
        "return": returns_to_go(steps["reward"], bounds, params.gamma),
    }


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> ReplayLearner:
    """Builds the TF side (see `agent.MARWIL`); every role builds the same networks.

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, the spaces are unsupported,
            or a custom torso breaks the contract of `easyrl.models.build_torso`.
    """
    check_model_kind("marwil", model, SPEC.model_kinds)
    check_spaces(obs_space, action_space)
    from easyrl.algorithms.marwil.agent import MARWIL

    return MARWIL(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("uniform",),  # the dataset's steps, sampled uniformly
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    dataset_items=dataset_items,
    model_kinds=("mlp", "custom"),  # `pi/torso`, `vf/torso` on flat observations
    offline_only=True,
    action_logp=True,  # off-policy evaluation of the learned policy on the dataset
    fused_update=True,  # `agent.fuse_update`: a lone learner's update in one call
)
"""MARWIL, as the runtime knows it (BC's too, with its own `Params`)."""
