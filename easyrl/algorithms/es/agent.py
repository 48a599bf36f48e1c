"""The TensorFlow side of OpenAI-ES: the policy MLP, batched perturbed acting, the round gradient.

Actor: every env i of the vector runs its own parameters theta + sign_i * sigma * eps_i; the
N parameter vectors sit in one `[N, P]` variable and one compiled call does the N forwards
(an mlp: per-layer `[N, in, out]` weights, `einsum`; a custom torso: env by env, each env's
parameters assigned to a scratch copy of the policy). Learner: `es_gradient` over the round's
records. Policy: torso -> linear head; Discrete: argmax, Box: low + (tanh(out) + 1) / 2 *
(high - low).
"""

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import CompiledGreedy, compiled
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.es.params import FLOW, MODEL_KINDS, Params, es_gradient, noise
from easyrl.algorithms.registry import check_model_kind
from easyrl.errors import ConfigError
from easyrl.models import ACTIVATIONS, Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables

_SEED_HIGH = 2**31
"""Perturbation seeds are drawn uniformly from [0, _SEED_HIGH)."""


class Policy(tf.Module):
    """theta's network: the model's torso (`policy`; an mlp has an activation after every
    hidden layer) and a linear head (`policy/out`) with small initial weights, so that the
    initial policy is close to uniform / centred."""

    def __init__(self, obs_dim: int, out_dim: int, model, seed: int):
        super().__init__(name=None)
        rng = np.random.default_rng(seed)
        self.torso = build_torso(model, (obs_dim,), "policy", rng)
        self.head = Dense(self.torso.out_dim, out_dim, "policy/out", rng, scale=0.1)

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        return self.head(self.torso(obs))  # [N, out]


class ES(CompiledGreedy):
    """ES's pieces for the runtime: the policy, the actor-side collector and the round gradient.

    Args:
        params: hyper-parameters.
        obs_space: a flat gymnasium Box observation space.
        action_space: a Discrete space, or a flat Box with finite bounds.
        model: the config's `model` section (an mlp or a custom torso).
        seed: initialisation seed (every role builds identical initial values).

    Raises:
        ConfigError: unsupported model kind, observation or action space, or a custom torso
            that breaks its contract.
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        check_model_kind("es", model, MODEL_KINDS)
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ConfigError(f"es needs a flat Box observation, got {obs_space}")
        self.params = params
        self.obs_dim = int(obs_space.shape[0])
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            out_dim = int(action_space.n)
            self._action_start = int(action_space.start)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            low, high = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
            if not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise ConfigError(f"es needs finite Box action bounds, got {action_space}")
            out_dim = int(action_space.shape[0])
            self._low = tf.constant(low, tf.float32)  # [A]
            self._half_range = tf.constant(0.5 * (high - low), tf.float32)  # [A]
        else:
            raise ConfigError(f"es needs a Discrete or flat Box action space, got {action_space}")
        try:
            self.policy = Policy(self.obs_dim, out_dim, model, seed)
            # A custom torso's per-env forwards run in a scratch copy (see `per_env_outputs`).
            custom = model.kind != "mlp"
            scratch = Policy(self.obs_dim, out_dim, model, seed) if custom else None
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = named_variables(self.policy)
        self.flat = FlatVariables(list(self.variables.values()))
        self.num_params = self.flat.size
        self._activation = ACTIVATIONS[model.activation]
        self._scratch = scratch
        self._scratch_flat = (
            None if scratch is None else FlatVariables(list(named_variables(scratch).values()))
        )
        # An mlp, per layer in forward order: (w start, w end, w shape, b start, b end) in the
        # flat vector, whose order is that of `self.variables` (sorted by name).
        names = list(self.variables)
        spans = {
            n: (int(self.flat.offsets[k]), int(self.flat.offsets[k + 1]))
            for k, n in enumerate(names)
        }
        layers = [f"policy/{i}" for i in range(len(model.hidden))] + ["policy/out"]
        self._layout = [
            (*spans[f"{n}/w"], tuple(self.variables[f"{n}/w"].shape), *spans[f"{n}/b"])
            for n in (layers if scratch is None else [])
        ]
        obs = tf.TensorSpec([None, self.obs_dim], tf.float32)
        flat = tf.TensorSpec([None, self.num_params], tf.float32)
        self._greedy = compiled(self._greedy_fn, obs)  # the unperturbed policy theta
        self._forward = compiled(self.per_env_outputs, obs, flat)

    def collector(
        self, num_envs: int, seed: int, actor_index: int = 0, num_actors: int = 1
    ) -> "PerturbationCollector":
        """The actor-side round collector for `num_envs` envs; `seed` seeds its seed draws."""
        return PerturbationCollector(self, num_envs, seed)

    def end_round(self, batch: dict) -> list[str]:
        """ES keeps no state outside its weights: nothing changes after a round."""
        return []

    def forward(self, obs: np.ndarray, flat_params: np.ndarray) -> np.ndarray:
        """Raw outputs (logits, or pre-tanh for Box) `[N, out]` of env i's policy with its own
        flat parameters `flat_params[i]` (`[N, P]`, in the order of `variables`)."""
        return self._forward(
            np.asarray(obs, np.float32), np.asarray(flat_params, np.float32)
        ).numpy()

    def learn_round(
        self, batch: dict[str, np.ndarray], rng: np.random.Generator
    ) -> Iterator[LearnStep]:
        """Turns one round of records into one gradient (against the current `variables`).

        Args:
            batch: the round's records (`replay_spec` columns), all of one version.
            rng: unused (the noise comes from the records' seeds).

        Yields:
            Once: a LearnStep of the gradients in the order of `self.variables` and stats.
        """
        theta = self.flat.read().numpy()  # [P]
        returns = np.concatenate([batch["return_pos"], batch["return_neg"]])  # [2n]
        grad = es_gradient(
            theta,
            batch["seed"],
            batch["return_pos"],
            batch["return_neg"],
            self.params.sigma,
            self.params.weight_decay,
        )  # [P]
        stats = {
            "return_mean": float(np.mean(returns)),
            "return_max": float(np.max(returns)),
            "return_min": float(np.min(returns)),
            "grad_norm": float(np.linalg.norm(grad.astype(np.float64))),
            "theta_norm": float(np.linalg.norm(theta.astype(np.float64))),
            "pairs": float(len(batch["seed"])),
            "env_steps": float(np.sum(batch["steps"])),
        }
        grads: list[np.ndarray | None] = list(self.flat.split(grad))
        yield LearnStep(grads, stats)

    def per_env_outputs(self, obs: tf.Tensor, flat: tf.Tensor) -> tf.Tensor:
        """Policy outputs `[N, out]` with per-env flat parameters `flat` `[N, P]` (TF code)."""
        if self._scratch is not None:
            return self._each_env_outputs(obs, flat)
        x = obs  # [N, in]
        last = len(self._layout) - 1
        for k, (w0, w1, w_shape, b0, b1) in enumerate(self._layout):
            w = tf.reshape(flat[:, w0:w1], [-1, *w_shape])  # [N, in, out]
            x = tf.einsum("ni,nio->no", x, w) + flat[:, b0:b1]  # [N, out]
            if k < last:
                x = self._activation(x)
        return x

    def _each_env_outputs(self, obs: tf.Tensor, flat: tf.Tensor) -> tf.Tensor:
        """`per_env_outputs` for any torso: env by env, its parameters assigned to the scratch
        policy, then its observation forwarded (one env at a time: they share the scratch)."""
        scratch, scratch_flat = self._scratch, self._scratch_flat
        assert scratch is not None and scratch_flat is not None, "an mlp uses the einsum path"

        def one_env(args):
            obs_i, theta = args  # [in], [P]
            parts = scratch_flat.split_tensor(theta)
            assigns = [v.assign(p) for v, p in zip(scratch_flat.variables, parts, strict=True)]
            with tf.control_dependencies(assigns):
                return scratch(obs_i[None])[0]  # [out]

        return tf.map_fn(
            one_env, (obs, flat), fn_output_signature=tf.float32, parallel_iterations=1
        )  # [N, out]

    def to_action(self, out: tf.Tensor) -> tf.Tensor:
        """Maps raw outputs `[N, out]` to env actions: `[N]` int64 or `[N, A]` float32."""
        if self.discrete:
            return tf.argmax(out, axis=1) + self._action_start  # [N]
        return self._low + (tf.tanh(out) + 1.0) * self._half_range  # [N, A]

    def _greedy_fn(self, obs):
        return self.to_action(self.policy(obs))


class PerturbationCollector:
    """Runs one round's antithetic evaluations on a vector of envs and gathers the records.

    Evaluation j of a round with E = `episodes_per_perturbation` is pair j // (2E), sign +1
    for even j and -1 for odd j: each pair's evaluations are consecutive, so its noise is
    generated once and both signs run side by side. Envs take the queued evaluations in order
    as their episodes end; an env with nothing left runs theta and its results are discarded.

    Args:
        agent: the `ES` whose `variables` hold theta.
        num_envs: envs in the vector.
        seed: seeds the rng the perturbation seeds are drawn from.
    """

    resets_envs = True
    """The actor resets every env at the start of each round: all envs start fresh episodes."""

    def __init__(self, agent: ES, num_envs: int, seed: int):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.agent = agent
        self.num_envs = num_envs
        self._rng = np.random.default_rng(seed)
        self._episodes = agent.params.episodes_per_perturbation
        self._theta = agent.flat.read().numpy()  # [P]
        # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
        self._params = tf.Variable(np.tile(self._theta, (num_envs, 1)), trainable=False)  # pyright: ignore[reportArgumentType]  # [N, P]
        self._active = False
        self._seeds = np.zeros(0, np.int64)  # [S]
        self.last_action_logp: np.ndarray | None = None  # deterministic perturbed policies
        obs = tf.TensorSpec([num_envs, agent.obs_dim], tf.float32)
        rows = tf.TensorSpec([None, agent.num_params], tf.float32)
        index = tf.TensorSpec([None], tf.int32)
        self._act = compiled(self._act_fn, obs)
        self._set_rows = compiled(self._set_rows_fn, index, rows)

    def start_round(self, share: int) -> None:
        """Starts a round of `share` pairs with the theta now in the agent's variables."""
        if share < 0:
            raise ValueError(f"share must be >= 0, got {share}")
        self._theta = self.agent.flat.read().numpy()  # [P]
        self._seeds = self._rng.integers(0, _SEED_HIGH, size=share, dtype=np.int64)  # [S]
        self._sums = np.zeros((share, 2), np.float64)  # [S, sign (+, -)] summed returns
        self._steps = np.zeros(share, np.int64)  # [S]
        self._total = 2 * self._episodes * share
        self._next, self._finished = 0, 0
        self._noise: dict[int, np.ndarray] = {}
        self._env_eval = np.full(self.num_envs, -1, np.int64)  # [N] evaluation index, -1: none
        self._ep_return = np.zeros(self.num_envs, np.float64)  # [N]
        self._ep_steps = np.zeros(self.num_envs, np.int64)  # [N]
        self._active = True
        self._hand_out(np.arange(self.num_envs))

    @property
    def seeds(self) -> np.ndarray:
        """The current round's perturbation seeds `[S]` (empty before the first round)."""
        return self._seeds.copy()

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions of every env's own perturbed policy, `[N, obs]` -> `[N]` or `[N, A]`.

        `rng` is unused: the perturbed policies are deterministic (ES explores in parameters).
        """
        return self._act(np.asarray(obs, np.float32)).numpy()

    def observe(
        self,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        real_next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> dict[str, np.ndarray] | None:
        """Accounts one vector step; returns the round's records once all are done, else None.

        Returns:
            {"seed": [S] int64, "return_pos": [S] float32, "return_neg": [S] float32 (means over
            the pair's episodes), "steps": [S] int64 (env steps of the pair, both signs)}, once
            per round; None before and after.
        """
        rewards = np.asarray(rewards, np.float64).reshape(-1)  # [N]
        done = (np.asarray(terminated, bool) | np.asarray(truncated, bool)).reshape(-1)  # [N]
        if rewards.shape[0] != self.num_envs or done.shape[0] != self.num_envs:
            raise ValueError(f"expected {self.num_envs} rewards and done flags")
        if not self._active:
            return None
        self._ep_return += rewards
        self._ep_steps += 1
        ended = np.flatnonzero(done)  # [D]
        for i in ended:
            j = self._env_eval[i]
            if j >= 0:
                pair, sign_index = int(j) // (2 * self._episodes), int(j) % 2  # 0: +, 1: -
                self._sums[pair, sign_index] += self._ep_return[i]
                self._steps[pair] += self._ep_steps[i]
                self._finished += 1
        self._ep_return[ended] = 0.0
        self._ep_steps[ended] = 0
        if ended.size:
            self._hand_out(ended)
        if self._finished < self._total:
            return None
        self._active = False
        means = self._sums / self._episodes  # [S, 2]
        return {
            "seed": self._seeds.copy(),
            "return_pos": means[:, 0].astype(np.float32),
            "return_neg": means[:, 1].astype(np.float32),
            "steps": self._steps.copy(),
        }

    def stats(self) -> dict[str, float]:
        """No diagnostics of acting: the round's returns reach the learner in the records."""
        return {}

    def env_parameters(self) -> np.ndarray:
        """The flat parameters `[N, P]` each env's policy currently runs."""
        return self._params.numpy()

    def _hand_out(self, envs: np.ndarray) -> None:
        """Gives each of `envs` the next queued evaluation (theta when none is left)."""
        rows = []
        for i in envs:
            if self._next < self._total:
                j = self._next
                self._next += 1
                self._env_eval[i] = j
                rows.append(self._perturbed(j))
            else:
                self._env_eval[i] = -1
                rows.append(self._theta)
        self._set_rows(np.asarray(envs, np.int32), np.stack(rows))

    def _perturbed(self, j: int) -> np.ndarray:
        """theta + sign * sigma * eps for evaluation j, `[P]`."""
        pair = j // (2 * self._episodes)
        if pair not in self._noise:
            self._noise[pair] = noise(self._seeds[pair], self.agent.num_params)
        eps = self._noise[pair]
        if j == (pair + 1) * 2 * self._episodes - 1:  # the pair's last evaluation
            del self._noise[pair]
        sign = 1.0 if j % 2 == 0 else -1.0
        return self._theta + np.float32(sign * self.agent.params.sigma) * eps

    def _act_fn(self, obs):
        return self.agent.to_action(self.agent.per_env_outputs(obs, self._params))

    def _set_rows_fn(self, index, rows):
        self._params.scatter_nd_update(index[:, None], rows)
