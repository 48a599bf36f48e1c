"""OpenAI evolution strategies (Salimans et al. 2017) on the "sync_rounds" flow.

A round: the learner publishes theta; each actor evaluates its share of antithetic pairs
theta +- sigma * eps(seed) and ships one record (seed, return_pos, return_neg, steps) per pair;
the learner turns the whole round into one gradient (`es_gradient`) that the PS applies with
its optimizer. Only seeds and returns travel: eps is regenerated from the seed (`noise`).
"""

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, RoundsAgent
from easyrl.algorithms.es import params
from easyrl.algorithms.es.params import (
    Params,
    centered_ranks,
    es_gradient,
    noise,
)

__all__ = [
    "Params",
    "SPEC",
    "build",
    "centered_ranks",
    "es_gradient",
    "noise",
    "optimizer",
    "replay_spec",
    "round_share",
]


def optimizer(params: Params):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one perturbation-pair record, as {name: (per-item shape, dtype)}."""
    return {
        "seed": ((), np.dtype(np.int64)),
        "return_pos": ((), np.dtype(np.float32)),
        "return_neg": ((), np.dtype(np.float32)),
        "steps": ((), np.dtype(np.int64)),
    }


def round_share(params: Params, num_envs: int, actor_index: int, num_actors: int) -> int:
    """Perturbation pairs actor `actor_index` of `num_actors` evaluates per round.

    `population // num_actors`, plus one for the first `population % num_actors` actors, so
    the shares sum to `population` (an actor may get 0 when actors outnumber pairs).

    Raises:
        ValueError: `num_actors < 1` or `actor_index` is not in [0, num_actors).
    """
    if num_actors < 1 or not 0 <= actor_index < num_actors:
        raise ValueError(f"need 0 <= actor_index < num_actors, got {actor_index}, {num_actors}")
    base, extra = divmod(params.population, num_actors)
    return base + (1 if actor_index < extra else 0)


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> RoundsAgent:
    """Builds the TF side of ES (imports TensorFlow; see `agent.ES`); every role builds the
    same policy, whatever `learner` says.

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, the observation is not a flat
            Box, the action space is neither Discrete nor a flat Box with finite bounds, or a
            custom torso breaks the contract of `easyrl.models.build_torso`.
    """
    from easyrl.algorithms.es.agent import ES

    return ES(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("aggregate",),  # rounds of (seed, returns) records
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    round_share=round_share,
    model_kinds=params.MODEL_KINDS,
)
"""Evolution strategies, as the runtime knows it."""
