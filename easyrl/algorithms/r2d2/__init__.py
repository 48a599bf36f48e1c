"""R2D2 (Kapturowski et al. 2019): recurrent Ape-X DQN on sequences with stored states.

Actors act epsilon-greedily (Ape-X's per-actor rates) with an LSTM Q network, carry its state
per env (zeros at an episode start) and ship overlapping sequences of T = `burn_in` +
`learn_length` steps of one env, a new one every `period` steps, each with the state the actor
held before its first step. The prioritized (or uniform) memory shards store and sample them
like any item. Learners unroll the online and target networks from the stored state: the first
`burn_in` steps only warm the state up (no gradient), the loss is on the `learn_length` steps
after them.

Targets (double Q, n-step within the sequence, value rescaling h), for a learning step t of the
sequence, with m = min(n, L - t) steps left to the sequence end L:
    a*_j = argmax_a Q(x_j, a)                                 (online network)
    G_t  = sum_{k<m} (prod_{i<k} discount_{t+i}) r_{t+k}
           + (prod_{i<m} discount_{t+i}) h^-1(Q_target(x_{t+m}, a*_{t+m}))
    td_t = h(G_t) - Q(x_t, a_t);   loss = mean_b(w_b * mean_t(0.5 td_t^2))
    priority_b = eta * max_t |td_t| + (1 - eta) * mean_t |td_t|
    h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x                (identity without rescaling)
Episode ends: discount_t = gamma * (1 - done_t), done = terminated | truncated (as IMPALA:
nothing is bootstrapped across an episode end inside a sequence). This package holds the
hyper-parameters and the numpy side (`params`: what `agent.py` imports too); `agent.R2D2` the
TensorFlow side.
"""

from easyrl.algorithms import dqn
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.r2d2 import params
from easyrl.algorithms.r2d2.params import Params, replay_spec

__all__ = ["Params", "SPEC", "build", "optimizer", "replay_spec"]

optimizer = dqn.optimizer
"""The PS optimizer: DQN's (`optimizer`, `lr` and its schedule)."""


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of R2D2 (imports TensorFlow; see `agent.R2D2`); every role builds
    the same networks, whatever `learner` says.

    Raises:
        ConfigError: unsupported spaces, or no `model.lstm`.
    """
    from easyrl.algorithms.r2d2.agent import R2D2

    return R2D2(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("prioritized", "uniform"),
    params_class=Params,
    build=build,
    optimizer=dqn.optimizer,
    replay_spec=replay_spec,
    model_kinds=("mlp", "conv", "custom", "encoders"),
    recurrence="only",  # the LSTM core is the point
    fused_update=True,  # `agent.fuse_update`: a lone learner's update in one call
)
"""R2D2, as the runtime knows it."""
