"""The TensorFlow side of IMPALA (and A3C): actor-critic network, V-trace, unroll collection,
the loss.

Loss to minimize on a batch of B unrolls of T steps (means over all T * B steps):
    policy_loss   = -mean_{t,b}(log pi(a_t|x_t) * pg_advantage_t)
    baseline_loss = 0.5 * mean_{t,b}((vs_t - V(x_t))^2)
    entropy       = mean_{t,b}(H(pi(.|x_t))),  H(p) = -sum_a p_a log p_a
    loss          = policy_loss + baseline_cost * baseline_loss - entropy_cost * entropy
with vs_t and pg_advantage_t the V-trace targets (see `vtrace`), held constant.

With `model.lstm` > 0 an LSTM core (`easyrl.models.lstm.LSTMCore`) sits between the torso and
the heads: actors carry its state per env (zeros at an episode start) and ship each unroll's
initial state and episode-start flags; the learner runs the core over the unroll from that
state, resetting where an episode starts, as the actor did.

With an action mask (`easyrl.envs.flat`) the network sees the features only and its logits of
illegal actions are `masking.ILLEGAL`: acting (Gumbel-max) never samples one, greedy play never
picks one, the shipped behaviour logits, log pi and the entropy give them probability 0.
"""

import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import (
    CompiledGreedy,
    FusesItsStep,
    NoTargetNetwork,
    checked_columns,
    compiled,
    flat_gradients,
)
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.impala.params import FLOW, AgentParams, check_spaces, unroll_spec
from easyrl.algorithms.masking import features, masked
from easyrl.algorithms.sampling import gumbel_max, gumbel_noise
from easyrl.algorithms.unrolls import SequenceCollector
from easyrl.envs.flat import action_mask_size, observation_parts
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables, GradientStep
from easyrl.models.lstm import LSTMCore, recurrent_step, recurrent_unroll

STAT_NAMES: tuple[str, ...] = ("policy_loss", "baseline_loss", "entropy", "rho_mean", "value_mean")
"""Keys of the stats `IMPALA.learn` returns."""

_SEQ = tf.TensorSpec([None, None], tf.float32)  # [T, B]
_VEC = tf.TensorSpec([None], tf.float32)  # [B]
_SCALAR = tf.TensorSpec([], tf.float32)


@tf.function(autograph=False, input_signature=[_SEQ] * 5 + [_VEC] + [_SCALAR] * 3)
def vtrace(
    behaviour_logp, target_logp, rewards, discounts, values, bootstrap_value, rho_bar, c_bar, lam
):
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, eq. 1 and 4.2).

    With rho_t = exp(target_logp_t - behaviour_logp_t), V(x_T) = vs_T = bootstrap_value:
        delta_t = min(rho_bar, rho_t) * (r_t + discount_t * V(x_{t+1}) - V(x_t))
        c_t     = lam * min(c_bar, rho_t)
        vs_t - V(x_t) = delta_t + discount_t * c_t * (vs_{t+1} - V(x_{t+1}))
        pg_advantage_t = min(rho_bar, rho_t) * (r_t + discount_t * vs_{t+1} - V(x_t))
    The recursion runs backwards over time with `tf.scan`.

    Args:
        behaviour_logp: log mu(a_t|x_t), `[T, B]`.
        target_logp: log pi(a_t|x_t), `[T, B]`.
        rewards: r_t, `[T, B]`.
        discounts: gamma * (1 - done_t), `[T, B]`.
        values: V(x_t), `[T, B]`.
        bootstrap_value: V(x_T), `[B]`.
        rho_bar: importance-weight clip (TD errors and policy gradient).
        c_bar: trace-coefficient clip.
        lam: V-trace lambda.

    Returns:
        (vs `[T, B]`, pg_advantages `[T, B]`), both float32 under stop_gradient.
    """
    inputs = (behaviour_logp, target_logp, rewards, discounts, values, bootstrap_value)
    behaviour_logp, target_logp, rewards, discounts, values, bootstrap_value = (
        tf.stop_gradient(x) for x in inputs
    )
    rho = tf.exp(target_logp - behaviour_logp)  # [T, B]
    clipped_rho = tf.minimum(rho_bar, rho)  # [T, B]
    cs = lam * tf.minimum(c_bar, rho)  # [T, B]
    next_values = tf.concat([values[1:], bootstrap_value[None]], axis=0)  # [T, B]
    deltas = clipped_rho * (rewards + discounts * next_values - values)  # [T, B]

    def backward(acc, step):  # acc = vs_{t+1} - V(x_{t+1}), [B]
        delta, discount, c = step
        return delta + discount * c * acc

    vs_minus_v = tf.scan(
        backward, (deltas, discounts, cs), initializer=tf.zeros_like(bootstrap_value), reverse=True
    )  # [T, B]
    vs = vs_minus_v + values  # [T, B]
    next_vs = tf.concat([vs[1:], bootstrap_value[None]], axis=0)  # [T, B]
    pg_advantages = clipped_rho * (rewards + discounts * next_vs - values)  # [T, B]
    return tf.stop_gradient(vs), tf.stop_gradient(pg_advantages)


class ActorCritic(tf.Module):
    """A shared torso (`net/torso`, mlp or conv as the model section says), an LSTM core
    `net/lstm` when `model.lstm` > 0, and two linear heads: policy logits `net/logits` (small
    init: a near-uniform first policy) and the value `net/value`. With `mask_size` n > 0 the
    last n entries of a (flat) observation are its action mask: the torso sees the others
    only, and the logits of illegal actions are `masking.ILLEGAL`. `parts`: where the keys of
    a flattened Dict/Tuple observation lie (for `model.encoders`)."""

    def __init__(self, obs_shape, num_actions, model, rng, mask_size: int = 0, parts=()):
        super().__init__(name=None)
        self.obs_shape = tuple(obs_shape)
        self.mask_size = mask_size
        features_shape = (self.obs_shape[0] - mask_size,) if mask_size else self.obs_shape
        self.torso = build_torso(model, features_shape, "net/torso", rng, parts)
        width = self.torso.out_dim
        self.core = LSTMCore(width, model.lstm, "net/lstm", rng) if model.lstm else None
        width = model.lstm or width
        self.logits = Dense(width, num_actions, "net/logits", rng, scale=0.01)
        self.value = Dense(width, 1, "net/value", rng, scale=1.0)
        self.state_size = self.core.state_size if self.core is not None else 0

    def __call__(self, obs):
        """Feed-forward: observations `[N, ...]` to (logits `[N, A]`, values `[N]`)."""
        return self._heads(self.torso(features(obs, self.mask_size)), obs)

    def _heads(self, h, obs):
        """The heads on features `h` `[N, H]`: (logits `[N, A]` masked by `obs` `[N, D]`,
        values `[N]`)."""
        return masked(self.logits(h), obs, self.mask_size), self.value(h)[:, 0]

    def step(self, obs, state, first):
        """Recurrent, one step of N envs: (logits `[N, A]`, values `[N]`, state `[N, 2U]`)."""
        assert self.core is not None
        x = features(obs, self.mask_size)
        (logits, values), state = recurrent_step(
            self.torso, self.core, lambda h: self._heads(h, obs), x, state, first
        )
        return logits, values, state

    def unroll(self, obs, state, first):
        """Recurrent, B unrolls: obs `[B, T + 1, ...]`, state `[B, 2U]` before step 0,
        first `[B, T + 1]`; returns (logits `[B, T + 1, A]`, values `[B, T + 1]`)."""
        assert self.core is not None
        b, steps = tf.shape(obs)[0], tf.shape(obs)[1]
        obs = tf.reshape(obs, [-1, *self.obs_shape])  # [B * (T+1), ...]
        x = features(obs, self.mask_size)
        logits, values = recurrent_unroll(
            self.torso, self.core, lambda h: self._heads(h, obs), x, state, first
        )
        return tf.reshape(logits, [b, steps, -1]), tf.reshape(values, [b, steps])  # [B, T+1]


class IMPALA(CompiledGreedy, NoTargetNetwork, FusesItsStep):
    """IMPALA's (and A3C's) pieces for the runtime: the network, unroll collection and the
    V-trace actor-critic gradients.

    Args:
        params: the agent's settings (from IMPALA's or A3C's `Params`).
        obs_space: a Box observation space (flat for an mlp, [H, W, C] for a conv).
        action_space: a Discrete action space.
        model: the config's `model` section.
        seed: initialisation seed (every role builds identical initial values).

    Raises:
        ConfigError: unsupported spaces or model kind.
    """

    flow: Flow = FLOW
    """Execution flow (an instance built for A3C says "actor_gradients")."""

    def __init__(self, params: AgentParams, obs_space, action_space, model, seed: int = 0):
        check_spaces(obs_space, action_space, model, params.name)
        self.params = params
        self.flow = params.flow
        self.obs_shape = tuple(int(d) for d in obs_space.shape)
        self.obs_dtype = np.dtype(obs_space.dtype)
        self.num_actions = int(action_space.n)
        rng = np.random.default_rng(seed)
        mask = action_mask_size(obs_space)
        parts = observation_parts(obs_space)
        self.net = ActorCritic(self.obs_shape, self.num_actions, model, rng, mask, parts)
        self.state_size = self.net.state_size
        """Width of the recurrent state per env (0: a feed-forward policy)."""
        self.spec = unroll_spec(params.unroll_length, obs_space, action_space, model.lstm)
        self.variables = named_variables(self.net)
        self._flat = FlatVariables(list(self.variables.values()))
        # Fixed input signatures: no retracing, and AutoGraph stays off.
        obs_tf_dtype = tf.as_dtype(self.obs_dtype)
        obs = tf.TensorSpec([None, *self.obs_shape], obs_tf_dtype)
        t = params.unroll_length
        batch_signature = [
            tf.TensorSpec([None, t + 1, *self.obs_shape], obs_tf_dtype),  # obs
            tf.TensorSpec([None, t], tf.int64),  # action
            tf.TensorSpec([None, t, self.num_actions], tf.float32),  # behaviour logits
            tf.TensorSpec([None, t], tf.float32),  # reward
            tf.TensorSpec([None, t], tf.float32),  # discount
        ]
        noise = tf.TensorSpec([None, self.num_actions], tf.float64)  # Gumbel, see `act`
        if self.state_size:
            state = tf.TensorSpec([None, self.state_size], tf.float32)
            first = tf.TensorSpec([None], tf.float32)
            self._forward = compiled(self.net.step, obs, state, first)
            self._act = compiled(self._act_step_fn, obs, noise, state, first)
            self._greedy = compiled(self._greedy_step_fn, obs, state, first)
            batch_signature += [state, tf.TensorSpec([None, t + 1], tf.float32)]
        else:
            self._forward = compiled(self.net.__call__, obs)
            self._act = compiled(self._act_fn, obs, noise)
            self._greedy = compiled(self._greedy_fn, obs)  # argmax of the logits
        self._step = GradientStep(self._step_fn, *batch_signature)

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "UnrollCollector":
        """The actor-side unroll collector for `num_envs` envs (see `UnrollCollector`).
        `actor_index` and `num_actors` are accepted for the runtime's uniform call: every
        actor explores the same way, by sampling its policy."""
        return UnrollCollector(self, num_envs, seed)

    def evaluate(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The network on a batch `[N, *obs_shape]`: (logits `[N, A]`, values `[N]`); a
        recurrent one from the zero state of an episode start."""
        obs = np.asarray(obs, self.obs_dtype)
        if self.state_size:
            state = np.zeros((len(obs), self.state_size), np.float32)
            logits, values, _ = self._forward(obs, state, np.ones(len(obs), np.float32))
        else:
            logits, values = self._forward(obs)
        return logits.numpy(), values.numpy()

    def learn(self, batch: dict, weights=None) -> LearnStep:
        """One gradient computation on a batch of unrolls.

        Args:
            batch: the `replay_spec` columns batch-major: obs `[B, T + 1, ...]`, action,
                reward, discount `[B, T]`, logits `[B, T, A]`.
            weights: replay importance weights; ignored (the trajectory table is a FIFO).

        Returns:
            a LearnStep: gradients of the loss in the order of `self.variables`, stats with
            the `STAT_NAMES` keys, no priorities. The variables are not changed.

        Raises:
            EasyRLError: a column is missing or has a wrong shape.
        """
        flat_grads, _, stats = self._step(*checked_columns(self.params.name, self.spec, batch))
        stats = dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))
        return LearnStep(self._step.gradients(flat_grads, self._flat), stats)

    # --- compiled functions ---------------------------------------------------------------

    def _act_fn(self, obs, noise):
        logits, _ = self.net(obs)  # [N, A]
        return gumbel_max(logits, noise), logits  # [N], [N, A]

    def _act_step_fn(self, obs, noise, state, first):
        logits, _, state = self.net.step(obs, state, first)  # [N, A], [N, 2U]
        return gumbel_max(logits, noise), logits, state  # [N], [N, A], [N, 2U]

    def _greedy_fn(self, obs):
        logits, _ = self.net(obs)  # [N, A]
        return tf.argmax(logits, axis=1)  # [N]

    def _greedy_step_fn(self, obs, state, first):
        logits, _, state = self.net.step(obs, state, first)  # [N, A], [N, 2U]
        return tf.argmax(logits, axis=1), state  # [N], [N, 2U]

    def loss(self, obs, action, behaviour_logits, reward, discount, state=None, first=None):
        """The loss on a batch of unrolls (see the module docstring), with its stats `[5]`
        (the `STAT_NAMES`); a recurrent network takes the unrolls' `state` `[B, 2U]` and
        `first` `[B, T + 1]` too."""
        p = self.params
        t, a = p.unroll_length, self.num_actions
        b = tf.shape(obs)[0]
        # Time-major views of the per-step columns.
        action_tm = tf.transpose(action)  # [T, B]
        reward_tm = tf.transpose(reward)  # [T, B]
        discount_tm = tf.transpose(discount)  # [T, B]
        behaviour_log_pi = tf.nn.log_softmax(tf.transpose(behaviour_logits, [1, 0, 2]))
        behaviour_logp = tf.gather(behaviour_log_pi, action_tm, axis=2, batch_dims=2)  # [T, B]
        if self.state_size:
            logits, values = self.net.unroll(obs, state, first)  # [B, T+1, A], [B, T+1]
        else:  # all B * (T + 1) observations through the network at once
            logits, values = self.net(tf.reshape(obs, [-1, *self.obs_shape]))
            logits = tf.reshape(logits, [b, t + 1, a])  # [B, T+1, A]
            values = tf.reshape(values, [b, t + 1])  # [B, T+1]
        log_pi = tf.nn.log_softmax(tf.transpose(logits[:, :t], [1, 0, 2]))  # [T, B, A]
        values_tm = tf.transpose(values[:, :t])  # [T, B]
        bootstrap_value = values[:, t]  # [B]
        target_logp = tf.gather(log_pi, action_tm, axis=2, batch_dims=2)  # [T, B]
        # The targets are constants of the loss: no gradient path into the scan.
        vs, pg_advantages = vtrace(
            behaviour_logp,
            tf.stop_gradient(target_logp),
            reward_tm,
            discount_tm,
            tf.stop_gradient(values_tm),
            tf.stop_gradient(bootstrap_value),
            p.rho_bar,
            p.c_bar,
            p.lam,
        )
        policy_loss = -tf.reduce_mean(target_logp * pg_advantages)
        baseline_loss = 0.5 * tf.reduce_mean(tf.square(vs - values_tm))
        entropy = tf.reduce_mean(-tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=2))
        loss = policy_loss + p.baseline_cost * baseline_loss - p.entropy_cost * entropy
        rho_mean = tf.reduce_mean(tf.exp(target_logp - behaviour_logp))
        stats = [policy_loss, baseline_loss, entropy, rho_mean, tf.reduce_mean(values_tm)]
        return loss, tf.stack(stats)  # [5]

    def _step_fn(self, *batch):
        return flat_gradients(
            lambda: self.loss(*batch), self.variables.values(), self.params.grad_clip
        )


class UnrollCollector(SequenceCollector):
    """Cuts the experience of `num_envs` envs into unrolls of T steps, one per env
    (`SequenceCollector`): every T-th `observe` returns the N unrolls. Unrolls continue
    episodes across their boundaries: the bootstrap observation obs[:, T] of one unroll is
    the first observation obs[:, 0] of the next one. A recurrent policy's state is carried
    per env from zeros and reset where an episode starts.

    The batch: the `replay_spec` columns batch-major: obs `[N, T + 1, ...]` (the space's
    dtype), action `[N, T]` int64, logits `[N, T, A]`, reward and discount `[N, T]` float32,
    discount = gamma * (1 - (terminated | truncated)) (an episode end of either kind is not
    bootstrapped, see `easyrl.algorithms.impala`); a recurrent policy's also state `[N, 2U]`
    and first `[N, T + 1]` float32.

    Args:
        algo: the actor's IMPALA (its variables hold the current weights).
        num_envs: envs in the vector env.
        seed: seed of the collector's own rng, used when `act` gets no rng.

    Raises:
        EasyRLError: `num_envs` is not positive.
    """

    def __init__(self, algo: IMPALA, num_envs: int, seed: int = 0):
        self.algo = algo
        self.unroll_length = algo.params.unroll_length
        self._rng = np.random.default_rng(seed)
        columns = {
            "action": ((), np.int64),
            "logits": ((algo.num_actions,), np.float32),
            "reward": ((), np.float32),
            "discount": ((), np.float32),
        }
        super().__init__(
            num_envs,
            self.unroll_length,
            columns,
            algo.obs_shape,
            algo.obs_dtype,
            gamma=algo.params.gamma,
            state_size=algo.state_size,
            mask_size=algo.net.mask_size,
        )
        self._unrolls = 0

    def step(self, obs, state, first, rng):
        """One compiled call gives the logits and the sample, Gumbel-max
        (`easyrl.algorithms.sampling`) with the noise drawn from `rng` (the collector's own
        when None) and summed in float64; actions `[N]` int64."""
        rng = self._rng if rng is None else rng
        noise = gumbel_noise(rng, (self.num_envs, self.algo.num_actions), np.float64)
        if state is not None:
            action, logits, next_state = self.algo._act(obs, noise, state, first)
            next_state = next_state.numpy()
        else:
            action, logits = self.algo._act(obs, noise)
            next_state = None
        action = action.numpy()  # [N]
        return action, {"action": action, "logits": logits.numpy()}, next_state

    def finish(self, next_obs, real_next_obs):
        """The N unrolls (class docstring); `real_next_obs` is unused (not bootstrapped)."""
        self._unrolls += 1
        return super().finish(next_obs, real_next_obs)

    def stats(self) -> dict[str, float]:
        """Collector metrics for the actor's reports: `unrolls`, the unrolls completed."""
        return {"unrolls": float(self._unrolls)}
