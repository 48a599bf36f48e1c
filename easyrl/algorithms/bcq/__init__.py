"""Discrete BCQ (Fujimoto et al. 2019, "Benchmarking Batch Deep Reinforcement Learning
Algorithms"): batch-constrained Q-learning from a recorded dataset.

DQN (double Q with a target network, dueling heads, n-step returns; `easyrl.algorithms.dqn`)
plus a behaviour-cloning classifier G(a|s) trained on the logged actions. Q's argmax, for the
targets and for acting, only considers the actions the data makes plausible:

    allowed(s) = {a : G(a|s) / max_a' G(a'|s) > threshold}
    a*(s)      = argmax_{a in allowed(s)} Q(s, a)

threshold = 0 allows every action (DQN); values near 1 leave only the most logged action
(behaviour cloning). Trains from `input.dir` only (`offline_only`): the memory shards hold the
dataset's n-step transitions (`dataset_items`, the same as batch DQN's). Loss in `agent.BCQ`.
"""

from easyrl.algorithms import dqn
from easyrl.algorithms.bcq.params import Params
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent

__all__ = ["Params", "SPEC", "build", "dataset_items", "optimizer", "replay_spec"]

optimizer = dqn.optimizer
replay_spec = dqn.replay_spec
dataset_items = dqn.dataset_items


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of BCQ (imports TensorFlow; see `agent.BCQ`); every role builds
    the same networks, whatever `learner` says."""
    from easyrl.algorithms.bcq.agent import BCQ

    return BCQ(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow="async_replay",  # the learner samples the memory shards (which hold the dataset)
    replay_kinds=("uniform",),  # as every offline run samples its dataset
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    dataset_items=dataset_items,  # the same n-step transitions as batch DQN's
    model_kinds=("mlp", "conv", "custom"),  # Q and G: the torsos of DQN's Q network
    offline_only=True,
    fused_update=True,  # DQN's `fuse_update`: a lone learner's update in one call
)
"""Discrete BCQ, as the runtime knows it."""
