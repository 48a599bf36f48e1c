"""The TensorFlow side of DQN / Ape-X DQN: Q network, acting, initial priorities, loss.

Loss (double DQN, n-step, prioritized):
    a* = argmax_a Q(s', a)                      (online net when double_q, else target)
    y  = R + discount * Q_target(s', a*)         (discount = gamma^m, 0 at termination)
    td = y - Q(s, a);  loss = mean(w * huber(td));  new priority = |td|

With C51 (`num_atoms` N >= 2, atoms z_j evenly spaced on [v_min, v_max], Q = sum_j p_j z_j):
    m  = the target distribution p_target(s', a*) moved to R + discount * z, clipped to
         [v_min, v_max] and projected back onto the atoms (`categorical_projection`)
    ce = -sum_j m_j log p_j(s, a);  loss = mean(w * ce);  new priority = ce

With an action mask (`easyrl.envs.flat`) every argmax (acting, a*) runs over the legal
actions of its observation, and exploration draws among them; the network never sees the mask.
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import CompiledGreedy, FusesItsStep, compiled, flat_gradients
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.dqn.params import FLOW, Params, actor_epsilon
from easyrl.algorithms.masking import features, masked
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.envs.flat import action_mask_size, legal_actions, observation_parts
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables, GradientStep
from easyrl.models.lstm import LSTMCore


def _scaled_noise(size: int) -> tf.Tensor:
    """f(eps) = sign(eps) * sqrt(|eps|), eps ~ N(0, 1): a factor of factorized noise."""
    eps = tf.random.normal([size])
    return tf.sign(eps) * tf.sqrt(tf.abs(eps))


class NoisyDense(tf.Module):
    """A NoisyNet layer with factorized Gaussian noise (Fortunato et al. 2018):
    y = x @ (w + w_sigma * f(e_in) f(e_out)^T) + b + b_sigma * f(e_out), fresh noise at every
    call; `noisy=False` gives the means (evaluation). w, b ~ U(+-1/sqrt(in)); the sigmas start
    at sigma0 / sqrt(in)."""

    def __init__(self, in_dim: int, out_dim: int, name: str, rng: np.random.Generator, sigma0):
        super().__init__(name=None)
        bound = 1.0 / np.sqrt(in_dim)
        uniform = tf.constant(rng.uniform(-bound, bound, size=(in_dim + 1, out_dim)), tf.float32)
        self.w = tf.Variable(uniform[:-1], name=f"{name}/w")
        self.b = tf.Variable(uniform[-1], name=f"{name}/b")
        self.in_dim, self.out_dim = in_dim, out_dim
        sigma = np.float32(sigma0 * bound)
        self.w_sigma = tf.Variable(tf.fill([in_dim, out_dim], sigma), name=f"{name}/w_sigma")
        self.b_sigma = tf.Variable(tf.fill([out_dim], sigma), name=f"{name}/b_sigma")

    def __call__(self, x: tf.Tensor, noisy: bool = True) -> tf.Tensor:
        mean = tf.matmul(x, self.w) + self.b  # [B, out]
        if not noisy:
            return mean
        e_in, e_out = _scaled_noise(self.in_dim), _scaled_noise(self.out_dim)
        # x @ (w_sigma * outer(e_in, e_out)) = ((x * e_in) @ w_sigma) * e_out
        return mean + (tf.matmul(x * e_in, self.w_sigma) + self.b_sigma) * e_out


class QNetwork(tf.Module):
    """Q(s, .) from the configured torso (MLP, or conv on frames), with dueling
    value/advantage heads when asked (Q = V + A - mean(A), per atom with C51), C51's
    distribution over `atoms` atoms of `support` when atoms >= 2, and NoisyNet heads when
    `noisy_sigma` > 0. With `lstm` > 0 units an LSTM core `{name}/lstm` sits between the
    torso and the heads (R2D2: `torso`, `core` and `heads` are then called one by one). With
    `mask_size` n > 0 the last n entries of an observation are its action mask: the torso
    sees the others only, and `best` argmaxes over legal actions. `parts`: where the keys of
    a flattened Dict/Tuple observation lie (for `model.encoders`)."""

    def __init__(
        self,
        obs_shape,
        num_actions,
        model,
        dueling,
        seed,
        name,
        support: np.ndarray | None = None,
        noisy_sigma: float = 0.0,
        lstm: int = 0,
        mask_size: int = 0,
        parts=(),
    ):
        super().__init__(name=None)
        rng = np.random.default_rng(seed)
        self.mask_size = mask_size
        if mask_size:
            obs_shape = (obs_shape[0] - mask_size,)
        self.torso = build_torso(model, obs_shape, f"{name}/torso", rng, parts)
        width = self.torso.out_dim
        self.core = LSTMCore(width, lstm, f"{name}/lstm", rng) if lstm else None
        width = lstm or width
        self.dueling = dueling
        self.num_actions = num_actions
        self.support = None if support is None else tf.constant(support, tf.float32)  # [N]
        self.atoms = 1 if support is None else len(support)
        outputs = num_actions * self.atoms
        if noisy_sigma > 0:
            self.advantage = NoisyDense(width, outputs, f"{name}/advantage", rng, noisy_sigma)
        else:
            self.advantage = Dense(width, outputs, f"{name}/advantage", rng, scale=0.1)
        if dueling and noisy_sigma > 0:
            self.value = NoisyDense(width, self.atoms, f"{name}/value", rng, noisy_sigma)
        elif dueling:
            self.value = Dense(width, self.atoms, f"{name}/value", rng, scale=0.1)

    def logits(self, obs, noisy: bool = True):
        """`[B, A, N]`: the C51 logits of every action (N = 1 without C51: Q itself)."""
        return self.heads(self.torso(features(obs, self.mask_size)), noisy)

    def heads(self, h, noisy: bool = True):
        """`logits` of the features `h` `[B, H]` (the torso's, or the LSTM core's)."""
        adv = tf.reshape(_head(self.advantage, h, noisy), [-1, self.num_actions, self.atoms])
        if not self.dueling:
            return adv
        value = tf.reshape(_head(self.value, h, noisy), [-1, 1, self.atoms])
        return value + adv - tf.reduce_mean(adv, axis=1, keepdims=True)

    def __call__(self, obs, noisy: bool = True):
        """Q(s, .) `[B, A]`: the expected return under C51's distribution."""
        out = self.logits(obs, noisy)  # [B, A, N]
        if self.support is None:
            return out[:, :, 0]
        return tf.reduce_sum(tf.nn.softmax(out, axis=2) * self.support, axis=2)

    def best(self, obs, q):
        """argmax_a q `[B]` of values `q` `[B, A]` (of any network) over the actions legal
        in `obs`."""
        return tf.argmax(masked(q, obs, self.mask_size), axis=1)


def _head(layer, h, noisy: bool):
    return layer(h, noisy) if isinstance(layer, NoisyDense) else layer(h)


def categorical_projection(reward, discount, probs, support):
    """C51's target (Bellemare et al. 2017, algorithm 1): the distribution `probs` `[B, N]`
    on the atoms `support` `[N]` moved to reward + discount * z, clipped to [z_0, z_N-1], and
    projected back onto the atoms, each shifted atom's mass split between its two
    neighbours in proportion to closeness: m_j = sum_i p_i clip(1 - |Tz_i - z_j| / dz, 0, 1).

    Args:
        reward: `[B]`; discount: `[B]` (gamma^n, 0 at termination).

    Returns:
        m `[B, N]`, rows summing to 1 where `probs` rows do.
    """
    dz = support[1] - support[0]
    shifted = reward[:, None] + discount[:, None] * support[None, :]  # [B, N]
    shifted = tf.clip_by_value(shifted, support[0], support[-1])
    # weight[b, i, j]: the share of shifted atom i that lands on atom j
    weight = tf.clip_by_value(1.0 - tf.abs(shifted[:, :, None] - support) / dz, 0.0, 1.0)
    return tf.reduce_sum(probs[:, :, None] * weight, axis=1)  # [B, N]


def epsilon_greedy(
    greedy: np.ndarray, epsilon: float, num_actions: int, rng, legal: np.ndarray | None = None
):
    """Epsilon-greedy actions `[N]` around the greedy ones `[N]` (uniform among all
    `num_actions` with probability epsilon), and their log-probabilities `[N]` float32:
    log((1 - eps) + eps / A) for the greedy action, log(eps / A) for any other. With an
    action mask `legal` `[N, A]` bool, the draw is uniform among each row's L legal actions
    (A = L there)."""
    explore = rng.random(len(greedy)) < epsilon
    if legal is None:
        drawn = rng.integers(num_actions, size=len(greedy))
        uniform = epsilon / num_actions
    else:
        # argmax of uniform keys, illegal ones below every legal one: uniform over legal.
        drawn = np.argmax(np.where(legal, rng.random(legal.shape), -1.0), axis=1)  # [N]
        uniform = epsilon / legal.sum(axis=1)  # [N]
    actions = np.where(explore, drawn, greedy)
    with np.errstate(divide="ignore"):  # epsilon 0: log(0) = -inf for other actions
        logp = np.log(np.where(actions == greedy, 1.0 - epsilon + uniform, uniform))
    return actions.astype(np.int64), logp.astype(np.float32)


class DQN(CompiledGreedy, FusesItsStep):
    """DQN's pieces for the runtime: networks, acting, post-processing and the loss.

    Args:
        params: hyper-parameters.
        obs_space: a gymnasium Box observation space.
        action_space: a gymnasium Discrete action space.
        model: the config's `model` section.
        seed: initialisation seed (every role builds identical initial values).
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"dqn needs a Discrete action space, got {action_space}")
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"dqn needs a Box observation space, got {obs_space}")
        self.params = params
        self.target_update_period = params.target_update_period
        self.obs_shape = tuple(obs_space.shape)
        self.num_actions = int(action_space.n)
        self.obs_dtype = np.dtype(obs_space.dtype)
        self.mask_size = action_mask_size(obs_space)
        """Action-mask entries at the end of an observation (0: none)."""
        self.support = None  # C51's atoms
        if params.num_atoms > 1:
            self.support = np.linspace(params.v_min, params.v_max, params.num_atoms)
        heads = {
            "support": self.support,
            "noisy_sigma": params.noisy_sigma,
            "mask_size": self.mask_size,
            "parts": observation_parts(obs_space),
        }
        try:
            shape, actions = self.obs_shape, self.num_actions
            self.q = QNetwork(shape, actions, model, params.dueling, seed, "q", **heads)
            self.target = QNetwork(shape, actions, model, params.dueling, seed, "target", **heads)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = named_variables(self.q)
        # The Q network (what the target copies); `_flat`: all variables (BCQ adds its own).
        self._flat = self._q_flat = FlatVariables(list(self.variables.values()))
        self._target_flat = FlatVariables(list(named_variables(self.target).values()))
        # Fixed input signatures: converting numpy inputs is then cheap and nothing retraces.
        obs = tf.TensorSpec([None, *self.obs_shape], tf.as_dtype(self.obs_dtype))
        vec = tf.TensorSpec([None], tf.float32)
        act = tf.TensorSpec([None], tf.int64)
        self._greedy = compiled(self._greedy_fn, obs)
        # Acting explores through the heads' noise when they are noisy (evaluation does not).
        self._act_greedy = compiled(self._noisy_greedy_fn, obs) if params.noisy_sigma else None
        self._act_values = compiled(self._act_values_fn, obs)
        self._td_abs = compiled(self._td_abs_fn, obs, act, vec, obs, vec)
        self._step = GradientStep(self._step_fn, obs, act, vec, obs, vec, vec)
        self.sync_target()

    def postprocessor(self, num_envs: int) -> NStepAccumulator:
        """The actor-side n-step accumulator for `num_envs` envs."""
        return NStepAccumulator(
            num_envs, self.params.n_step, self.params.gamma, self.obs_shape, self.obs_dtype
        )

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "EpsilonGreedyCollector":
        """The actor-side collector: Ape-X epsilon-greedy acting and n-step transitions."""
        return EpsilonGreedyCollector(self, num_envs, actor_index, num_actors)

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions for a batch of observations `[N, obs]` -> `[N]`."""
        return self.act_with_logp(obs, epsilon, rng)[0]

    def act_with_logp(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator):
        """Epsilon-greedy actions `[N]` and their log-probabilities `[N]` float32 under the
        epsilon-greedy policy: log((1 - eps) + eps / A) for the greedy action, log(eps / A)
        for any other; with an action mask, exploration draws uniformly among the L legal
        actions of each row (A = L there)."""
        acting = self._act_greedy or self._greedy
        greedy = acting(np.asarray(obs, self.obs_dtype)).numpy()
        legal = legal_actions(obs, self.mask_size) if self.mask_size else None  # [N, A]
        return epsilon_greedy(greedy, epsilon, self.num_actions, rng, legal)

    def act_values(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator):
        """`act_with_logp`'s actions `[N]` and log-probabilities `[N]`, with the acting
        network's Q(s, a) of those actions `[N]` and V(s) = Q(s, a*) of the greedy ones `[N]`
        (float64), from the same forward pass (what the collector's initial priorities use)."""
        greedy, q = self._greedy_q(obs)
        legal = legal_actions(obs, self.mask_size) if self.mask_size else None  # [N, A]
        actions, logp = epsilon_greedy(greedy, epsilon, self.num_actions, rng, legal)
        rows = np.arange(len(q))
        return actions, logp, q[rows, actions], q[rows, greedy]

    def state_values(self, obs: np.ndarray) -> np.ndarray:
        """V(s) = Q(s, a*) `[N]` (float64) of the acting network, a* the greedy actions."""
        greedy, q = self._greedy_q(obs)
        return q[np.arange(len(q)), greedy]

    def _greedy_q(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The acting network's greedy actions `[N]` and Q-values `[N, A]` (float64)."""
        greedy, q = self._act_values(np.asarray(obs, self.obs_dtype))
        return greedy.numpy(), q.numpy().astype(np.float64)

    def initial_priorities(self, batch: dict) -> np.ndarray:
        """Ape-X initial priorities |TD| computed with the actor's copy of the network."""
        return self._td_abs(
            batch["obs"], batch["action"], batch["reward"], batch["next_obs"], batch["discount"]
        ).numpy()

    def learn(self, batch: dict, weights: np.ndarray) -> LearnStep:
        """One gradient computation on a sampled batch.

        Returns:
            a LearnStep: gradients in the order of `self.variables`, stats (`loss`, then the
            stats the `loss` method returns with it), new priorities |td| `[B]`.
        """
        flat_grads, loss, (stats, td_abs) = self._step(*self.step_inputs(batch, weights))
        stats = {"loss": float(loss), **{k: float(v) for k, v in stats.items()}}
        return LearnStep(self._step.gradients(flat_grads, self._flat), stats, td_abs.numpy())

    def step_inputs(self, batch: dict, weights: np.ndarray) -> tuple[np.ndarray, ...]:
        """The compiled step's inputs from a batch of n-step transitions and IS weights:
        obs, action, reward, next_obs, discount, weights, in their dtypes."""
        return (
            np.asarray(batch["obs"], self.obs_dtype),
            np.asarray(batch["action"], np.int64),
            np.asarray(batch["reward"], np.float32),
            np.asarray(batch["next_obs"], self.obs_dtype),
            np.asarray(batch["discount"], np.float32),
            np.asarray(weights, np.float32),
        )

    def sync_target(self) -> None:
        """Copies the online network into the target network."""
        self._target_flat.assign(self._q_flat.read())

    def _greedy_fn(self, obs):
        return self.q.best(obs, self.q(obs, noisy=False))  # [N]

    def _noisy_greedy_fn(self, obs):
        return self.q.best(obs, self.q(obs))  # [N]

    def _act_values_fn(self, obs):
        q = self.q(obs)  # [N, A], noisy when the heads are
        return self.q.best(obs, q), q  # [N], [N, A]

    def _distribution_terms(self, obs, action, reward, next_obs, discount, target):
        """C51: (cross-entropy `[B]` of p(s, a) to the projected target distribution of
        `target` (a QNetwork) at a*, Q(s, a) `[B]`); a* from the online net when double_q."""
        support = self.q.support
        assert support is not None, "C51 terms of a network without atoms"
        next_probs = tf.nn.softmax(target.logits(next_obs), axis=2)  # [B, A, N]
        if self.params.double_q and target is not self.q:
            best = self.q.best(next_obs, self.q(next_obs))  # [B]
        else:  # the target's own means: one pass (and one noise draw) when it is the online net
            best = self.q.best(next_obs, tf.reduce_sum(next_probs * support, axis=2))
        next_probs = tf.gather(next_probs, best, axis=1, batch_dims=1)  # [B, N]
        m = tf.stop_gradient(categorical_projection(reward, discount, next_probs, support))
        logits_sa = tf.gather(self.q.logits(obs), action, axis=1, batch_dims=1)  # [B, N]
        cross_entropy = -tf.reduce_sum(m * tf.nn.log_softmax(logits_sa), axis=1)  # [B]
        q_sa = tf.reduce_sum(tf.nn.softmax(logits_sa) * support, axis=1)  # [B]
        return cross_entropy, q_sa

    def _targets(self, reward, next_obs, discount):
        next_target = self.target(next_obs)  # [B, A]
        if self.params.double_q:
            best = self.q.best(next_obs, self.q(next_obs))  # [B]
        else:
            best = self.q.best(next_obs, next_target)
        bootstrap = tf.gather(next_target, best, axis=1, batch_dims=1)  # [B]
        return reward + discount * bootstrap

    def _td_abs_fn(self, obs, action, reward, next_obs, discount):
        if self.support is not None:  # C51: the loss the learner's priorities are
            return self._distribution_terms(obs, action, reward, next_obs, discount, self.q)[0]
        q_next = self.q(next_obs)  # [B, A]
        q_next = tf.gather(q_next, self.q.best(next_obs, q_next), axis=1, batch_dims=1)  # [B]
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)
        return tf.abs(reward + discount * q_next - q_sa)

    def loss(self, obs, action, reward, next_obs, discount, weights):
        """The loss on a batch (see the module docstring), with ({"q_mean": mean Q(s, a)}, the
        new priorities |td| `[B]`; with C51 the cross-entropy, see the module docstring)."""
        if self.support is not None:
            args = (obs, action, reward, next_obs, discount, self.target)
            cross_entropy, q_sa = self._distribution_terms(*args)
            stats = {"q_mean": tf.reduce_mean(q_sa)}
            return tf.reduce_mean(weights * cross_entropy), (stats, cross_entropy)
        y = tf.stop_gradient(self._targets(reward, next_obs, discount))  # [B]
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)  # [B]
        td = y - q_sa
        # Huber: 0.5 td^2 for |td| <= delta, delta (|td| - 0.5 delta) beyond.
        quadratic = tf.minimum(tf.abs(td), self.params.huber_delta)
        huber = 0.5 * tf.square(quadratic) + self.params.huber_delta * (tf.abs(td) - quadratic)
        return tf.reduce_mean(weights * huber), ({"q_mean": tf.reduce_mean(q_sa)}, tf.abs(td))

    def _step_fn(self, *batch):
        return flat_gradients(
            lambda: self.loss(*batch), self.variables.values(), self.params.grad_clip
        )


class EpsilonGreedyCollector:
    """An actor's side of DQN: epsilon-greedy actions with the Ape-X schedule of actor
    `actor_index` of `num_actors`, and n-step transitions out of the env steps.

    Protocol per vector step: `act(obs, rng)`, then `observe(...)`, which returns the
    transitions completed by an env step (or None).

    Without C51 the transitions carry their Ape-X initial priorities (`nstep.PRIORITY`) from
    the Q-values the acting forward pass computed anyway: Q(s_t, a_t) when acting on s_t,
    V(s_{t+m}) when acting on the next observation, so the shipment needs no network pass
    of its own (two per transition, ~30 % of a Pong actor's network time). A step therefore
    reaches the accumulator at the next `act`, and `observe` returns what the step before
    it completed; only a time-limit's final observation, which is never acted on, is
    evaluated on its own. C51's priorities (cross-entropies) come from
    `DQN.initial_priorities` when shipped.
    """

    def __init__(self, dqn: DQN, num_envs: int, actor_index: int, num_actors: int):
        self.dqn = dqn
        self.num_envs = num_envs
        self.actor_index, self.num_actors = actor_index, num_actors
        self.nstep = dqn.postprocessor(num_envs)
        self.env_steps = 0
        self.epsilon = actor_epsilon(dqn.params, actor_index, num_actors, 0)
        self.valued = dqn.support is None
        """Whether the transitions carry their initial priorities (not with C51)."""
        self._obs: np.ndarray | None = None
        self._actions: np.ndarray | None = None
        self._values: np.ndarray | None = None  # [N] Q(s_t, a_t) of the last act
        self._step: tuple | None = None  # the last observed step, not yet accumulated
        self._ready: dict | None = None  # what accumulating it completed
        self.last_action_logp: np.ndarray | None = None

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions `[N]` for `obs` `[N, obs]`."""
        self.epsilon = actor_epsilon(
            self.dqn.params, self.actor_index, self.num_actors, self.env_steps
        )
        if not self.valued:
            self._actions, self.last_action_logp = self.dqn.act_with_logp(obs, self.epsilon, rng)
        else:
            actions, logp, values, greedy_values = self.dqn.act_values(obs, self.epsilon, rng)
            if self._step is not None:  # obs: the step's next observations where not done
                self._ready = self._accumulate(self._step, greedy_values)
                self._step = None
            self._actions, self.last_action_logp, self._values = actions, logp, values
        self._obs = obs
        return self._actions

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> dict | None:
        """Feeds the step to the n-step accumulator; returns the completed transitions (with
        initial priorities: those of the step before, see the class docstring).

        Raises:
            EasyRLError: called without a preceding `act`.
        """
        if self._obs is None or self._actions is None:
            raise EasyRLError("observe() needs a preceding act()")
        self.env_steps += self.num_envs
        step = (self._obs, self._actions, rewards, real_next_obs, terminated, truncated)
        if not self.valued:
            return self.nstep.add(*step)
        self._step = (*step, self._values)
        self._obs = self._actions = None
        ready, self._ready = self._ready, None
        return ready

    def _accumulate(self, step: tuple, next_values: np.ndarray) -> dict | None:
        """Adds an observed `step` (observe's arguments and Q(s, a) `[N]`) with the V of the
        next observations acted on, `next_values` `[N]`; a time limit's final observation
        gets its own V."""
        obs, actions, rewards, real_next_obs, terminated, truncated, values = step
        cut = np.flatnonzero(np.asarray(truncated) & ~np.asarray(terminated))
        if cut.size:
            next_values = next_values.copy()
            next_values[cut] = self.dqn.state_values(real_next_obs[cut])
        return self.nstep.add(
            obs, actions, rewards, real_next_obs, terminated, truncated, values, next_values
        )

    def stats(self) -> dict[str, float]:
        """The current exploration rate."""
        return {"epsilon": self.epsilon}
