"""An algorithm of your own, a package like the built-in ones: plain one-step DQN on uniform
replay, written against easyrl's typed contract (`easyrl.algorithms.contract`). This module
is what loading a config reads (no TensorFlow); `agent.py` is the TensorFlow side. Name it
in a config as `algorithm: {name: my_algo, ...}` (see algo.yaml). The module declares itself
once, in `SPEC` at its end: easyrl reads that and nothing else of it.

Loss (one-step Q-learning with a target network):
    y = r + discount * max_a Q_target(s', a)        (discount = gamma, 0 at termination)
    loss = mean(huber(y - Q(s, a)))
"""

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec
from my_algo.params import FLOW, Params


def optimizer(params: Params):
    """Adam at `lr`, applied by the PS shards."""
    from easyrl.algorithms.optimizers import OptimizerSpec

    return OptimizerSpec(kind="adam", lr=params.lr)


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """One transition: {column: (per-item shape, dtype)}."""
    obs = (tuple(obs_space.shape), np.dtype(np.float32))
    scalar = ((), np.dtype(np.float32))
    return {
        "obs": obs,
        "action": ((), np.dtype(np.int64)),
        "reward": scalar,
        "next_obs": obs,
        "discount": scalar,
    }


def build(params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False):
    """The agent (imports TensorFlow only now, so that loading a config stays cheap)."""
    from my_algo.agent import PlainDQN

    return PlainDQN(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=FLOW,  # actors ship transitions; learners sample them asynchronously
    replay_kinds=("uniform",),  # the replay tables it works with, the default first
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    model_kinds=("mlp",),  # what it can do: the defaults say no more (no LSTM, no masks, ...)
)
"""My algorithm, as easyrl knows it."""
