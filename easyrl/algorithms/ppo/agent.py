"""The TensorFlow side of PPO: policy and value MLPs, acting, rollout collection, the loss.

Loss to minimize on a minibatch (ratio = exp(logp - logp_old), A normalized when asked):
    policy_loss = -mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))
    value_loss  = 0.5 * mean((V - Vt)^2)
                  or, with value_clip c > 0, 0.5 * mean(max((V - Vt)^2, (V_c - Vt)^2)),
                  V_c = V_old + clip(V - V_old, -c, c)
    loss        = policy_loss + vf_coef * value_loss - ent_coef * entropy
    approx_kl   = mean((ratio - 1) - log(ratio))   (k3 estimator: unbiased, never negative)

With `model.lstm` > 0 the policy and the value network each have an LSTM core; a round's
items are whole per-env sequences with the cores' states before their first step, and
minibatches are sets of sequences, each unrolled from its stored state (means over all
their steps), resetting where the actor did (`first`).
"""

import contextlib
import math
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import CompiledGreedy, compiled, flatten, gradients
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.policy_nets import ObsNorm, PolicyNet, ValueNet
from easyrl.algorithms.ppo.params import FLOW, Params, check_spaces, gae
from easyrl.algorithms.sampling import gumbel_max, gumbel_noise
from easyrl.algorithms.unrolls import SequenceCollector
from easyrl.envs.flat import action_mask_size, observation_parts
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models import named_variables
from easyrl.models.flat import FlatVariables

STAT_NAMES: tuple[str, ...] = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")
"""Keys of the stats `learn_round` yields with every minibatch gradient."""
COLUMNS = ("obs", "action", "logp", "advantage", "value_target", "value")
"""The round batch's columns (a recurrent policy's also has `state` and `first`)."""


def _strategy(params: Params, devices):
    """A MirroredStrategy over `devices`, over all GPUs when >1 is visible, else None."""
    if devices is not None:
        return tf.distribute.MirroredStrategy(devices=list(devices))
    if params.multi_gpu and len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return None


class PPO(CompiledGreedy):
    """PPO's pieces for the runtime: networks, rollout collection and the round's gradients.

    Args:
        params: hyper-parameters.
        obs_space: a flat gymnasium Box observation space.
        action_space: a Discrete or flat bounded Box action space.
        model: the config's `model` section (an mlp or a custom torso).
        seed: initialisation seed (every role builds identical initial values).
        devices: force a MirroredStrategy over these devices (each minibatch is split over
            them); None: one over all GPUs when `params.multi_gpu` and >1 GPU is visible.

    Raises:
        ConfigError: unsupported spaces, or a custom torso that breaks its contract.
    """

    flow: Flow = FLOW

    def __init__(
        self,
        params: Params,
        obs_space,
        action_space,
        model,
        seed: int = 0,
        devices: list[str] | None = None,
    ):
        check_spaces(obs_space, action_space)
        self.params = params
        self.obs_dim = int(obs_space.shape[0])
        self.mask_size = action_mask_size(obs_space)
        """Action-mask entries at the end of an observation (0: none); not normalized."""
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.strategy = _strategy(params, devices)
        scope = self.strategy.scope() if self.strategy else contextlib.nullcontext()
        with scope:
            rng = np.random.default_rng(seed)  # policy first, then value: one fixed stream
            clip = params.obs_clip if params.normalize_observations else None
            self.obs_norm = ObsNorm(self.obs_dim - self.mask_size, clip)
            net = (rng, self.obs_norm, self.mask_size, observation_parts(obs_space))
            try:
                self.pi = PolicyNet(self.obs_dim, action_space, model, params.log_std_init, *net)
                self.vf = ValueNet(self.obs_dim, model, *net)
            except ValueError as err:
                raise ConfigError(f"model: {err}") from err
        self.variables = dict(
            sorted({**named_variables(self.pi), **named_variables(self.vf)}.items())
        )
        self._flat = FlatVariables(list(self.variables.values()))
        self.state_size = 4 * model.lstm
        """Width of the recurrent state per env: policy c, h then value c, h (0: none)."""
        # Fixed input signatures: no retracing, and AutoGraph stays off.
        obs = tf.TensorSpec([None, self.obs_dim], tf.float32)
        vec = tf.TensorSpec([None], tf.float32)
        act = self.action_spec()
        noise = tf.TensorSpec([None, self.action_dim], tf.float32)
        if not self.state_size:
            self._act = compiled(self._act_fn, obs, noise)
            self._value = compiled(self._value_fn, obs)
            self._greedy = compiled(self.pi.greedy, obs)
            self._step = compiled(self._step_fn, obs, act, vec, vec, vec, vec)
            return
        state = tf.TensorSpec([None, self.state_size], tf.float32)
        self._act = compiled(self._act_step_fn, obs, noise, state, vec)
        self._value = compiled(self._value_step_fn, obs, state)
        self._greedy = compiled(self._greedy_step_fn, obs, state, vec)
        seq = tf.TensorSpec([None, params.rollout_length], tf.float32)  # [B, T]
        seq_obs = tf.TensorSpec([None, params.rollout_length, self.obs_dim], tf.float32)
        seq_act = tf.TensorSpec([None, params.rollout_length, *act.shape[1:]], act.dtype)
        self._step = compiled(self._step_fn, seq_obs, seq_act, seq, seq, seq, seq, state, seq)

    def action_spec(self) -> tf.TensorSpec:
        """Batched stored action: int64 `[B]` (Discrete) or float32 `[B, A]` (Box)."""
        if self.discrete:
            return tf.TensorSpec([None], tf.int64)
        return tf.TensorSpec([None, self.action_dim], tf.float32)

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "RolloutCollector":
        """The actor-side rollout collector for `num_envs` envs (see `RolloutCollector`);
        every actor collects the same way, whatever its index."""
        return RolloutCollector(self, num_envs, seed)

    def value(self, obs: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """V(obs) for a batch `[N, obs]` -> `[N]` float32; a recurrent network's from
        `state` `[N, 4U]` (the episodes go on: no reset)."""
        if self.state_size:
            return self._value(np.asarray(obs, np.float32), np.asarray(state, np.float32)).numpy()
        return self._value(np.asarray(obs, np.float32)).numpy()

    def learn_minibatch(self, minibatch: dict) -> LearnStep:
        """One gradient computation on a minibatch holding the `replay_spec` columns.

        Returns:
            a LearnStep: gradients of the loss in the order of `self.variables`, stats with
            the `STAT_NAMES` keys, no priorities. The variables are not changed (the PS
            applies gradients).
        """
        recurrent = ("state", "first") if self.state_size else ()
        flat_grads, stats = self._step(
            np.asarray(minibatch["obs"], np.float32),
            np.asarray(minibatch["action"], self.action_spec().dtype.as_numpy_dtype),
            *(np.asarray(minibatch[c], np.float32) for c in (*COLUMNS[2:], *recurrent)),
        )
        stats = dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))
        grads: list[np.ndarray | None] = list(self._flat.split(flat_grads.numpy()))
        return LearnStep(grads, stats)

    def learn_round(self, batch: dict, rng: np.random.Generator) -> Iterator[LearnStep]:
        """The round's gradient steps: `num_epochs` shuffled passes over `batch`.

        Each epoch splits a permutation (from `rng`) of the n items into ceil(n /
        minibatch_size) parts of near-equal size (sizes differ by at most one; nothing is
        dropped) and yields one LearnStep per part (see `learn_minibatch`). Between
        two yields the caller may assign new values to `self.variables`: every step reads
        them afresh. With `kl_target > 0`, the remaining epochs are skipped after an epoch
        whose minibatches' mean `approx_kl` exceeds 1.5 * kl_target.

        Raises:
            EasyRLError: `batch` lacks a column or its columns differ in length.
        """
        columns = (*COLUMNS, "state", "first") if self.state_size else COLUMNS
        missing = [c for c in columns if c not in batch]
        if missing:
            raise EasyRLError(f"ppo batch lacks columns {missing}; got {sorted(batch)}")
        n = len(batch["obs"])
        if n == 0 or any(len(batch[c]) != n for c in columns):
            lengths = {c: len(batch[c]) for c in columns}
            raise EasyRLError(f"ppo batch columns must share one non-zero length: {lengths}")
        # An item is a step, or a recurrent policy's sequence of `rollout_length` steps.
        steps = n * (self.params.rollout_length if self.state_size else 1)
        num_minibatches = min(n, math.ceil(steps / self.params.minibatch_size))
        for _ in range(self.params.num_epochs):
            kls = []
            for idx in np.array_split(rng.permutation(n), num_minibatches):
                step = self.learn_minibatch({c: batch[c][idx] for c in columns})
                kls.append(step.stats["approx_kl"])
                yield step
            if self.params.kl_target > 0 and np.mean(kls) > 1.5 * self.params.kl_target:
                return

    def end_round(self, batch: dict) -> list[str]:
        """After the round's updates, on the learner: folds the round's observations into
        the running statistics when normalizing (the next round uses them).

        Returns:
            The names of the variables changed here (the learner assigns them to the PS).
        """
        if not self.params.normalize_observations:
            return []
        obs = np.reshape(batch["obs"], (-1, self.obs_dim))  # [n, D]
        self.obs_norm.update(obs[:, : self.obs_dim - self.mask_size])
        return [n for n in self.variables if n.startswith("obs_norm/")]

    # --- compiled functions ---------------------------------------------------------------

    def _act_fn(self, obs, noise):
        out = self.pi(obs)  # [N, A]
        action = self._sample(out, noise)
        logp, _ = self.pi.log_prob_entropy_from(out, action)
        return action, logp, self.vf(obs)

    def _value_fn(self, obs):
        return self.vf(obs)  # [N]

    def _act_step_fn(self, obs, noise, state, first):
        half = self.state_size // 2
        out, pi_state = self.pi.step(obs, state[:, :half], first)  # [N, A], [N, 2U]
        value, vf_state = self.vf.step(obs, state[:, half:], first)  # [N], [N, 2U]
        action = self._sample(out, noise)
        logp, _ = self.pi.log_prob_entropy_from(out, action)
        return action, logp, value, tf.concat([pi_state, vf_state], axis=1)

    def _value_step_fn(self, obs, state):
        half = self.state_size // 2
        first = tf.zeros([tf.shape(obs)[0]])  # the episodes go on
        return self.vf.step(obs, state[:, half:], first)[0]  # [N]

    def _greedy_step_fn(self, obs, state, first):
        half = self.state_size // 2
        out, pi_state = self.pi.step(obs, state[:, :half], first)
        _, vf_state = self.vf.step(obs, state[:, half:], first)
        return self.pi.greedy_from(out), tf.concat([pi_state, vf_state], axis=1)

    def _sample(self, out, noise):
        if self.discrete:
            return gumbel_max(out, noise)  # [N]
        return out + tf.exp(self.pi.log_std) * noise  # [N, A], unclipped

    def _replica_grads(self, inputs, size):
        """Gradients and stat sums of one replica's slice of the minibatch, divided by the
        whole minibatch size `size`: the replicas' SUM is the whole minibatch's mean."""
        ctx = tf.distribute.get_replica_context()
        replica = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
        n = tf.shape(inputs[0])[0]
        lo = n * replica // ctx.num_replicas_in_sync
        hi = n * (replica + 1) // ctx.num_replicas_in_sync
        return self._grads([x[lo:hi] for x in inputs], size)

    def _grads(self, inputs, size):
        grads, _, stats = gradients(lambda: self.loss(*inputs, size=size), self.variables.values())
        return grads, stats

    def loss(
        self,
        obs,
        action,
        logp_old,
        advantage,
        value_target,
        value_old,
        state=None,
        first=None,
        *,
        size,
    ):
        """The loss on (a replica's slice of) a minibatch (see the module docstring), with the
        stats `[5]` (the `STAT_NAMES`); sums over the slice are divided by the whole
        minibatch's `size` in steps (see `_replica_grads`). A recurrent network's minibatch
        is B sequences `[B, T, ...]` with their `state` `[B, 4U]` and `first` `[B, T]`."""
        p = self.params
        if self.state_size:
            assert state is not None and first is not None, "a recurrent minibatch's state"
            half = self.state_size // 2
            out = self.pi.unroll(obs, state[:, :half], first)  # [B * T, A]
            value = self.vf.unroll(obs, state[:, half:], first)  # [B * T]
            flat = [-1, *action.shape[2:]]
            action = tf.reshape(action, flat)  # [B * T] or [B * T, A]
            logp_old, advantage, value_target, value_old = (
                tf.reshape(x, [-1]) for x in (logp_old, advantage, value_target, value_old)
            )
        else:
            out, value = self.pi(obs), self.vf(obs)  # [B, A], [B]
        logp, entropy = self.pi.log_prob_entropy_from(out, action)  # [B], [B]
        ratio = tf.exp(logp - logp_old)  # [B]
        clipped_ratio = tf.clip_by_value(ratio, 1.0 - p.clip, 1.0 + p.clip)
        surrogate = tf.minimum(ratio * advantage, clipped_ratio * advantage)  # [B]
        value_err = tf.square(value - value_target)  # [B]
        if p.value_clip > 0:
            value_c = value_old + tf.clip_by_value(value - value_old, -p.value_clip, p.value_clip)
            value_err = tf.maximum(value_err, tf.square(value_c - value_target))
        policy_loss = -tf.reduce_sum(surrogate) / size
        value_loss = 0.5 * tf.reduce_sum(value_err) / size
        mean_entropy = tf.reduce_sum(entropy) / size
        loss = policy_loss + p.vf_coef * value_loss - p.ent_coef * mean_entropy
        approx_kl = tf.reduce_sum(ratio - 1.0 - (logp - logp_old)) / size
        clip_frac = tf.reduce_sum(tf.cast(tf.abs(ratio - 1.0) > p.clip, tf.float32)) / size
        return loss, tf.stack([policy_loss, value_loss, mean_entropy, approx_kl, clip_frac])

    def _step_fn(self, obs, action, logp_old, advantage, value_target, value_old, *recurrent):
        if self.params.normalize_advantages:
            # Over the whole minibatch, before any split across replicas.
            mean, variance = tf.nn.moments(tf.reshape(advantage, [-1]), axes=[0])
            advantage = (advantage - mean) / (tf.sqrt(variance) + 1e-8)  # [B] or [B, T]
        inputs = (obs, action, logp_old, advantage, value_target, value_old, *recurrent)
        size = tf.cast(tf.size(advantage), tf.float32)  # steps
        if self.strategy is None:
            grads, stats = self._grads(inputs, size)
        else:
            per_replica = self.strategy.run(self._replica_grads, args=(inputs, size))
            grads, stats = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return flatten(grads, self.params.grad_clip), stats


class RolloutCollector(SequenceCollector):
    """Collects one round of `rollout_length` vector steps on an actor and turns it into the
    round batch (GAE advantages and value targets): `SequenceCollector`'s protocol per round,
    `start_round()`, then `rollout_length` times `act(obs, rng)` and `observe(...)`; the last
    `observe` returns the batch. The envs are not reset between rounds: the next round
    continues the same episodes.

    The batch: the `replay_spec` columns flattened time-major to
    `[rollout_length * num_envs, ...]` (item `t * N + i` is step t of env i), or per-env
    sequences `[N, T, ...]` with a recurrent policy. Bootstraps: V(next state) is the next
    `act`'s value, except V(real_next_obs) for truncated rows and for the round's last step;
    0 for terminated rows. The env action is `[N]` int64, or `[N, A]` float32 clipped to the
    bounds (the stored action and its log-prob are the unclipped sample).

    Args:
        algo: the actor's PPO (its variables hold the round's weights).
        num_envs: envs in the vector env.
        seed: seed of the collector's own rng, used when `act` gets no rng.
    """

    def __init__(self, algo: PPO, num_envs: int, seed: int = 0):
        self.algo = algo
        self.rollout_length = algo.params.rollout_length
        self._rng = np.random.default_rng(seed)
        action = ((), np.int64) if algo.discrete else ((algo.action_dim,), np.float32)
        columns = {
            "action": action,
            "logp": ((), np.float32),
            "value": ((), np.float32),
            "reward": ((), np.float32),
            "terminated": ((), bool),
            "truncated": ((), bool),
            "truncated_value": ((), np.float32),  # V(final obs) of truncated rows
        }
        super().__init__(
            num_envs,
            self.rollout_length,
            columns,
            (algo.obs_dim,),
            np.float32,
            state_size=algo.state_size,
            mask_size=algo.mask_size,
        )
        self.start_round()

    def start_round(self, share: int | None = None) -> None:
        """Starts a new round (after the round's weights were swapped in), dropping any
        partial round. `share` (items per round) is fixed by `rollout_length` for PPO and
        only checked when given."""
        steps = self.algo.params.rollout_length * self.num_envs
        expected = self.num_envs if self.algo.state_size else steps  # sequences, or steps
        if share is not None and share != expected:
            raise EasyRLError(f"PPO collects {expected} items per round, asked for {share}")
        self.steps.clear()

    def step(self, obs, state, first, rng):
        """Samples actions with one compiled call, the noise drawn from `rng` (the
        collector's own when None), so acting is reproducible."""
        rng = self._rng if rng is None else rng
        shape = (self.num_envs, self.algo.action_dim)
        if self.algo.discrete:
            noise = gumbel_noise(rng, shape, np.float32)
        else:
            noise = rng.standard_normal(shape).astype(np.float32)
        next_state = None
        if state is not None:
            action, logp, value, next_state = self.algo._act(obs, noise, state, first)
            next_state = next_state.numpy()
        else:
            action, logp, value = self.algo._act(obs, noise)
        action, self.last_action_logp = action.numpy(), logp.numpy()
        columns = {"action": action, "logp": self.last_action_logp, "value": value.numpy()}
        if not self.algo.discrete:
            space = self.algo.action_space
            action = np.clip(action, space.low, space.high).astype(np.float32)
        return action, columns, next_state

    def outcome(self, reward, terminated, truncated, real_next_obs):
        """reward, terminated, truncated and V(real_next_obs) of the truncated rows (0
        elsewhere, and on the round's last step, which `finish` bootstraps whole)."""
        n, steps = self.num_envs, self.steps
        real_next_obs = np.asarray(real_next_obs, np.float32)
        if real_next_obs.shape != (n, self.algo.obs_dim):
            raise EasyRLError(f"observations must be [{n}, {self.algo.obs_dim}]")
        truncated_value = np.zeros(n, np.float32)
        if steps.row < self.rollout_length - 1:  # the last step bootstraps all rows below
            rows = np.flatnonzero(truncated & ~terminated)
            if rows.size:
                state = steps.state[rows] if self.algo.state_size else None  # not reset
                truncated_value[rows] = self.algo.value(real_next_obs[rows], state)
        return {
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "truncated_value": truncated_value,
        }

    def finish(self, next_obs, real_next_obs):
        """The round batch (class docstring)."""
        state = self.steps.state if self.algo.state_size else None  # after the step, not reset
        return self._round_batch(self.algo.value(np.asarray(real_next_obs, np.float32), state))

    def _round_batch(self, last_value: np.ndarray) -> dict[str, np.ndarray]:
        """The round batch (class docstring) of the completed round, whose last step's
        successors have the values `last_value` `[N]`."""
        steps = self.steps
        value = steps.time_major("value")  # [T, N]
        terminated, truncated = steps.time_major("terminated"), steps.time_major("truncated")
        # Last step: real_next_obs equals next_obs except on done rows, where it is the
        # needed successor (truncated) or unused (terminated): one value call covers all.
        next_values = np.concatenate([value[1:], last_value[None]])
        head = truncated[:-1]  # [T-1, N]
        next_values[:-1][head] = steps.time_major("truncated_value")[:-1][head]
        advantage, value_target = gae(
            steps.time_major("reward"),
            value,
            next_values,
            terminated,
            terminated | truncated,
            self.algo.params.gamma,
            self.algo.params.lam,
        )
        if self.algo.state_size:  # per-env sequences, batch-major [N, T, ...]
            batch = {c: steps.batch_major(c) for c in ("obs", "action", "logp")}
            batch["advantage"] = np.swapaxes(advantage, 0, 1).copy()
            batch["value_target"] = np.swapaxes(value_target, 0, 1).copy()
            batch["value"] = steps.batch_major("value")
            return {**batch, **steps.recurrent(bootstrap=False)}  # state [N, 4U], first [N, T]
        size = self.rollout_length * self.num_envs
        action = steps.time_major("action")  # [T, N] or [T, N, A]
        return {
            "obs": steps.time_major("obs").reshape(size, -1),
            "action": action.reshape(size, *action.shape[2:]),
            "logp": steps.time_major("logp").reshape(size),
            "advantage": advantage.reshape(size),
            "value_target": value_target.reshape(size),
            "value": value.reshape(size),
        }

    def stats(self) -> dict[str, float]:
        """No diagnostics of acting: the round's stats come from the learner."""
        return {}
