"""The TensorFlow side of LinUCB: the A/b variables, the UCB choice and the A/b increments.

UCB score of arm k for a context x (computed in float64 through a Cholesky factor
A_k = L_k L_k^T, so that A_k is never inverted explicitly):

    theta_k = A_k^-1 b_k,   width_k = ||L_k^-1 x|| = sqrt(x^T A_k^-1 x)
    ucb_k   = theta_k . x + alpha * width_k

Increments of a batch of logged steps (x_i, a_i, r_i), with one-hot e_i = onehot(a_i):

    dA_k = sum_i e_ik x_i x_i^T,   db_k = sum_i e_ik r_i x_i

`learn` returns (-dA, -db): the PS applies them with SGD at learning rate 1 (see the package
docstring).
"""

import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import CompiledGreedy, NoTargetNetwork, checked_columns, compiled
from easyrl.algorithms.contract import Flow, LearnStep, concat
from easyrl.algorithms.linucb.params import FLOW, Params, optimizer, replay_spec
from easyrl.errors import EasyRLError
from easyrl.models import named_variables


class ArmModels(tf.Module):
    """The per-arm statistics: `linucb/A` `[K, d, d]` (starts at ridge * I) and `linucb/b`
    `[K, d]` (starts at 0)."""

    def __init__(self, num_arms: int, dim: int, ridge: float):
        super().__init__(name=None)
        eye = np.broadcast_to(ridge * np.eye(dim, dtype=np.float32), (num_arms, dim, dim))
        # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
        self.A = tf.Variable(eye, name="linucb/A")  # pyright: ignore[reportArgumentType]
        self.b = tf.Variable(np.zeros((num_arms, dim), np.float32), name="linucb/b")  # pyright: ignore[reportArgumentType]


class LinUCB(CompiledGreedy, NoTargetNetwork):
    """LinUCB's pieces for the runtime: the arm statistics, acting and the increments.

    Args:
        params: hyper-parameters.
        obs_space: a flat Box observation space (the context, d dims).
        action_space: a Discrete action space (K arms).
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space):
        self.params = params
        self.spec = replay_spec(params, obs_space, action_space)
        self.num_arms, self.dim = int(action_space.n), int(obs_space.shape[0])
        self.model = ArmModels(self.num_arms, self.dim, params.ridge)
        self.variables = named_variables(self.model)  # {"linucb/A", "linucb/b"}
        context = tf.TensorSpec([None, self.dim], tf.float32)
        arm = tf.TensorSpec([None], tf.int64)
        reward = tf.TensorSpec([None], tf.float32)
        self._scores = compiled(self._scores_fn, context)
        self._greedy = compiled(self._greedy_fn, context)  # argmax_k theta_k . x, no bonus
        self._increments = compiled(self._increments_fn, context, arm, reward)

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "UCBCollector":
        """The actor-side collector (see `UCBCollector`); every actor explores the same way,
        by the confidence bonus, so the seed and the actor's index do not matter."""
        return UCBCollector(self, num_envs)

    def scores(self, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Estimated rewards theta_k . x and confidence widths sqrt(x^T A_k^-1 x) of every arm
        for contexts `[N, d]`: (means `[N, K]`, widths `[N, K]`), float64."""
        means, widths = self._scores(np.asarray(contexts, np.float32))
        return means.numpy(), widths.numpy()

    def act(self, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The UCB choice for contexts `[N, d]`: (arms argmax_k means + alpha * widths `[N]`
        int64, ties to the lowest arm; the chosen arms' widths `[N]`)."""
        means, widths = self.scores(contexts)
        arms = np.argmax(means + self.params.alpha * widths, axis=1).astype(np.int64)
        return arms, widths[np.arange(len(arms)), arms]

    def learn(self, batch: dict, weights=None) -> LearnStep:
        """The increments of a batch of logged steps, as gradients for the PS.

        Args:
            batch: `context` `[B, d]`, `arm` `[B]`, `reward` `[B]`.
            weights: replay importance weights; ignored (the table is a FIFO).

        Returns:
            a LearnStep: [-dA `[K, d, d]`, -db `[K, d]`] in the order of `self.variables`,
            stats, no priorities. The variables are not changed.

        Raises:
            EasyRLError: a column is missing, has a wrong shape, or names an arm out of range.
        """
        context, arm, reward = checked_columns("linucb", self.spec, batch)
        n = len(context)
        if n and not (0 <= arm.min() and arm.max() < self.num_arms):
            raise EasyRLError(f"linucb batch has arms outside [0, {self.num_arms})")
        d_a, d_b = self._increments(context, arm, reward)
        stats = {"reward_mean": float(reward.mean()) if n else 0.0}
        return LearnStep([-d_a.numpy(), -d_b.numpy()], stats)

    # --- compiled functions ---------------------------------------------------------------

    def _theta_and_cholesky(self):
        a = tf.cast(self.model.A, tf.float64)  # [K, d, d]
        chol = tf.linalg.cholesky(a)  # [K, d, d], lower
        b = tf.cast(self.model.b, tf.float64)[:, :, None]  # [K, d, 1]
        theta = tf.linalg.cholesky_solve(chol, b)[:, :, 0]  # [K, d]
        return theta, chol

    def _scores_fn(self, context):
        x = tf.cast(context, tf.float64)  # [N, d]
        theta, chol = self._theta_and_cholesky()
        means = tf.matmul(x, theta, transpose_b=True)  # [N, K]
        rhs = tf.broadcast_to(tf.transpose(x)[None], [self.num_arms, self.dim, tf.shape(x)[0]])
        z = tf.linalg.triangular_solve(chol, rhs, lower=True)  # [K, d, N] = L_k^-1 x
        widths = tf.transpose(tf.sqrt(tf.reduce_sum(tf.square(z), axis=1)))  # [N, K]
        return means, widths

    def _greedy_fn(self, context):
        theta, _ = self._theta_and_cholesky()
        means = tf.matmul(tf.cast(context, tf.float64), theta, transpose_b=True)  # [N, K]
        return tf.argmax(means, axis=1)  # [N]

    def _increments_fn(self, context, arm, reward):
        onehot = tf.one_hot(arm, self.num_arms, dtype=tf.float32)  # [B, K]
        d_a = tf.einsum("bk,bi,bj->kij", onehot, context, context)  # [K, d, d]
        d_b = tf.einsum("bk,b,bi->ki", onehot, reward, context)  # [K, d]
        return d_a, d_b


class UCBCollector:
    """An actor's side of LinUCB: UCB arm choices with the actor's copy of A and b, and one
    logged step (context, arm, reward) per env step.

    Protocol per vector step: `act(obs, rng)`, then `observe(...)`, which returns the step's
    items (every step completes `num_envs` of them).
    """

    def __init__(self, agent: LinUCB, num_envs: int):
        self.agent = agent
        self.num_envs = num_envs
        self._contexts = self._arms = None
        self._width = 0.0
        self.last_action_logp: np.ndarray | None = None  # deterministic arms

    def act(self, obs: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        """UCB arms `[N]` for contexts `obs` `[N, d]` (deterministic: `rng` is not used)."""
        arms, widths = self.agent.act(obs)
        self._width = float(widths.mean())
        self._contexts, self._arms = np.asarray(obs, np.float32), arms
        return arms

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> dict:
        """The step's logged items: `context` `[N, d]`, `arm` `[N]`, `reward` `[N]`."""
        if self._contexts is None:
            raise EasyRLError("observe() called before act()")
        items = {
            "context": self._contexts,
            "arm": self._arms,
            "reward": np.asarray(rewards, np.float32),
        }
        self._contexts = self._arms = None
        return items

    def stats(self) -> dict[str, float]:
        """The confidence width of the last chosen arms (it shrinks as the arms are
        learned)."""
        return {"ucb_width": self._width}


def regret_run(
    params: Params, env_id: str, steps: int, num_envs: int = 1, seed: int = 0, env_kwargs=None
) -> tuple[np.ndarray, np.ndarray]:
    """Runs LinUCB in this process for `steps` env steps and returns what the distributed
    runtime cannot see: the per-step regret `info["regret"]` of the env (the built-in
    `easyrl/LinearBandit-v0` reports it).

    The update path is the runtime's: the actor's `UCBCollector`, the learner's `learn` on
    batches of `params.batch_size` logged steps (in the order they were logged), and the PS's
    optimizer (`OptimizerGroups` with this algorithm's `optimizer`) applying the pushed
    increments; only the network between them is left out, and the actor sees every update
    at once.

    Returns:
        (regret `[steps]` float64, reward `[steps]` float64), in step order (vector step by
        vector step, env by env).

    Raises:
        EasyRLError: the env does not report `regret` in its info (see
            `easyrl.envs.bandit.vector_regrets`).
    """
    from easyrl.algorithms.optimizers import OptimizerGroups
    from easyrl.envs import make_vector_env
    from easyrl.envs.bandit import vector_regrets

    env = make_vector_env(env_id, num_envs, seed=seed, kwargs=env_kwargs)
    try:
        agent = LinUCB(params, env.single_observation_space, env.single_action_space)
        values = {n: v.numpy() for n, v in agent.variables.items()}
        ps_optimizer = OptimizerGroups(optimizer(params), values)
        collector = agent.collector(num_envs, seed)
        obs, _ = env.reset(seed=seed)
        regrets, rewards, pending = [], [], []
        for _ in range(-(-steps // num_envs)):
            arms = collector.act(obs, None)
            obs, reward, terminated, truncated, info = env.step(arms)
            regrets.append(vector_regrets(info, num_envs))
            rewards.append(reward)
            pending.append(collector.observe(reward, obs, obs, terminated, truncated))
            while sum(len(p["arm"]) for p in pending) >= params.batch_size:
                items = concat(pending)
                batch = {k: v[: params.batch_size] for k, v in items.items()}
                pending = [{k: v[params.batch_size :] for k, v in items.items()}]
                grads, _, _ = agent.learn(batch)
                # As the learner pushes them (LinUCB's gradients are never None).
                named = {n: g for n, g in zip(agent.variables, grads, strict=True) if g is not None}
                ps_optimizer.apply(named)
                for name, value in ps_optimizer.values().items():
                    agent.variables[name].assign(value)
    finally:
        env.close()
    return np.concatenate(regrets)[:steps], np.concatenate(rewards)[:steps]
