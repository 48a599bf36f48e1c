"""The TensorFlow side of my_algo: the Q network, the loss, acting (see `__init__.py`)."""

import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import flat_gradients
from easyrl.algorithms.contract import Batch, LearnStep
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables
from my_algo.params import FLOW, Params


class QNetwork(tf.Module):
    """Q(s, .): the configured torso (`model` section), then a linear head."""

    def __init__(self, obs_shape, num_actions, model, seed, name):
        super().__init__(name=None)
        rng = np.random.default_rng(seed)
        self.torso = build_torso(model, obs_shape, f"{name}/torso", rng)
        self.head = Dense(self.torso.out_dim, num_actions, f"{name}/head", rng, scale=0.1)

    def __call__(self, obs):
        return self.head(self.torso(obs))  # [B, A]


class PlainDQN:
    """A `contract.ReplayAgent`: variables, greedy acting, a collector, `learn`, targets."""

    flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int):
        self.params = params
        self.target_update_period = params.target_update_period
        self.num_actions = int(action_space.n)
        obs_shape = tuple(obs_space.shape)
        self.q = QNetwork(obs_shape, self.num_actions, model, seed, "q")
        self.target = QNetwork(obs_shape, self.num_actions, model, seed, "target")
        self.variables = named_variables(self.q)  # what the PS shards hold
        self._flat = FlatVariables(list(self.variables.values()))
        self._target_flat = FlatVariables(list(named_variables(self.target).values()))
        obs = tf.TensorSpec([None, *obs_shape], tf.float32)
        vec = tf.TensorSpec([None], tf.float32)
        act = tf.TensorSpec([None], tf.int64)
        self._greedy = tf.function(
            lambda o: tf.argmax(self.q(o), axis=1), autograph=False, input_signature=[obs]
        )
        self._step = tf.function(
            self._step_fn, autograph=False, input_signature=[obs, act, vec, obs, vec]
        )
        self.sync_target()

    def loss(self, obs, action, reward, next_obs, discount):
        """The loss of a batch of transitions, and the mean Q as a stat."""
        y = tf.stop_gradient(reward + discount * tf.reduce_max(self.target(next_obs), axis=1))
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)  # [B]
        return tf.reduce_mean(tf.keras.losses.huber(y[:, None], q_sa[:, None])), q_sa

    def _step_fn(self, *batch):
        flat, loss, q_sa = flat_gradients(lambda: self.loss(*batch), self.variables.values(), 0)
        return flat, loss, tf.reduce_mean(q_sa)

    def learn(self, batch: Batch, weights: np.ndarray | None) -> LearnStep:
        """Gradients of the loss on a sampled batch (uniform replay: no weights)."""
        columns = ("obs", "action", "reward", "next_obs", "discount")
        flat, loss, q_mean = self._step(*(batch[c] for c in columns))
        stats = {"loss": float(loss), "q_mean": float(q_mean)}
        return LearnStep(self._flat.split(flat.numpy()), stats)

    def sync_target(self) -> None:
        """Copies the online network into the target network."""
        self._target_flat.assign(self._flat.read())

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions `[N]`."""
        return self._greedy(np.asarray(obs, np.float32)).numpy()

    @property
    def greedy_fn(self):
        """The compiled greedy policy (what `easyrl export` saves)."""
        return self._greedy

    def collector(self, num_envs: int, seed: int, actor_index: int, num_actors: int):
        """The actor side: epsilon-greedy acting and one-step transitions."""
        return EpsilonGreedy(self, num_envs)


class EpsilonGreedy:
    """A `contract.Collector`: acts epsilon-greedily, returns each step's transitions."""

    last_action_logp = None  # not recorded for offline datasets

    def __init__(self, agent: PlainDQN, num_envs: int):
        self.agent, self.num_envs = agent, num_envs
        self._obs = self._actions = None

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Greedy actions, each replaced by a random one with probability epsilon."""
        greedy = self.agent.greedy(obs)
        explore = rng.random(len(obs)) < self.agent.params.epsilon
        self._obs = np.asarray(obs, np.float32)
        self._actions = np.where(
            explore, rng.integers(self.agent.num_actions, size=len(obs)), greedy
        )
        return self._actions

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> Batch:
        """The step's transitions (`real_next_obs`: the final observation at episode ends)."""
        return {
            "obs": self._obs,
            "action": self._actions.astype(np.int64),
            "reward": np.asarray(rewards, np.float32),
            "next_obs": np.asarray(real_next_obs, np.float32),
            "discount": np.where(terminated, 0.0, self.agent.params.gamma).astype(np.float32),
        }

    def stats(self) -> dict[str, float]:
        """The exploration rate."""
        return {"epsilon": self.agent.params.epsilon}
