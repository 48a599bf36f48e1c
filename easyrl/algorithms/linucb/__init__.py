"""LinUCB (Li et al. 2010, "disjoint" linear model per arm) on the distributed runtime.

Per arm k, with contexts x_t of the steps that pulled arm k and their rewards r_t:

    A_k = ridge * I + sum_t x_t x_t^T      [d, d]
    b_k = sum_t r_t x_t                     [d]
    theta_k = A_k^-1 b_k
    pull argmax_k  theta_k . x + alpha * sqrt(x^T A_k^-1 x)

How it maps onto the runtime (flow "async_replay" with a trajectory FIFO):
- A `[K, d, d]` and b `[K, d]` are the PS variables (`linucb/A`, `linucb/b`), initialised to
  ridge * I and 0.
- Actors pull A and b like any weights and act with the UCB rule above; each env step is one
  item (context, arm, reward) shipped to memory.
- The memory shard is a FIFO (`replay.kind: trajectory`): a sample removes what it returns, so
  every logged step reaches exactly one learner batch.
- The learner turns a batch into the increments dA_k = sum x x^T and db_k = sum r x of the
  arms it pulled and pushes their NEGATIVES as "gradients": the PS applies them with plain SGD
  at learning rate 1 (x <- x - 1 * g), which adds the increments. Sums commute, so a late push
  is as right as a fresh one: the PS never drops one as stale (`Params.max_staleness`), and
  after every item has been pushed A and b hold exactly the sums above (up to float32
  rounding), whatever the order or the number of learners.

Actors act on A and b as of their last weight pull (`actor.weight_sync_every`): LinUCB with
slightly delayed feedback. The `model` section is not used. `greedy` (evaluation, export)
pulls argmax_k theta_k . x, without the exploration bonus.
"""

from easyrl.algorithms.contract import AlgorithmSpec, ReplayAgent
from easyrl.algorithms.linucb import params
from easyrl.algorithms.linucb.params import Params, check_spaces, optimizer, replay_spec

__all__ = ["Params", "SPEC", "build", "check_spaces", "optimizer", "replay_spec"]


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> ReplayAgent:
    """Builds the TF side of LinUCB (imports TensorFlow; see `agent.LinUCB`); `model`,
    `seed` and `learner` do not matter: A and b start at ridge * I and 0 everywhere.

    Raises:
        ConfigError: unsupported spaces (see `check_spaces`).
    """
    check_spaces(obs_space, action_space)
    from easyrl.algorithms.linucb.agent import LinUCB

    return LinUCB(params, obs_space, action_space)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("trajectory",),  # FIFO: every logged step reaches exactly one batch
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
)
"""LinUCB, as the runtime knows it."""
