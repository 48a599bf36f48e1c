"""The TensorFlow pieces every algorithm's agent uses; imported by `agent.py` modules (and the
evaluator) only: it imports TensorFlow.

`compiled` functions, the gradient step (`flat_gradients`: tape, loss, gradients, global-norm
clip, one flat vector), greedy acting (`CompiledGreedy`, and `greedy_policy` /
`RecurrentGreedy` for evaluation), `NoTargetNetwork` and `checked_columns` (a batch checked
against its columns). The families' own pieces: `easyrl.algorithms.continuous.actor_critic`
(TD3/DDPG, SAC) and `easyrl.algorithms.policy_nets` (PPO/A2C/PG, MARWIL/BC).
"""

from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
import tensorflow as tf

from easyrl.algorithms.contract import Agent, RecurrentAgent
from easyrl.algorithms.optimizers import LocalOptimizer
from easyrl.envs.evaluation import EpisodicPolicy, Stateless
from easyrl.errors import EasyRLError
from easyrl.models.flat import Compiled, GradientStep


def compiled(fn: Callable, *signature: tf.TensorSpec) -> Compiled:
    """`fn` compiled with a fixed input signature (`easyrl.models.flat.Compiled`)."""
    return Compiled(fn, *signature)


def gradients(
    loss_fn: Callable[[], tuple[tf.Tensor, Any]], variables: Iterable[tf.Variable]
) -> tuple[list, tf.Tensor, Any]:
    """The gradients of a loss, inside a compiled function.

    Args:
        loss_fn: `() -> (loss, aux)`, run under the tape: the scalar loss, and what else the
            step hands back (stats, priorities), untouched.
        variables: the variables to differentiate, in gradient order.

    Returns:
        (gradients, one per variable, zeros where the loss does not reach it; loss; aux).
    """
    variables = list(variables)
    with tf.GradientTape() as tape:
        loss, aux = loss_fn()
    grads = tape.gradient(loss, variables)
    return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)], loss, aux


def flatten(grads: list[tf.Tensor], clip: float) -> tf.Tensor:
    """Gradients as one flat vector, clipped to global norm `clip` first (0: no clip)."""
    if clip > 0:
        grads, _ = tf.clip_by_global_norm(grads, clip)
    return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)


def flat_gradients(
    loss_fn: Callable[[], tuple[tf.Tensor, Any]], variables: Iterable[tf.Variable], clip: float
) -> tuple[tf.Tensor, tf.Tensor, Any]:
    """An agent's gradient step, inside its compiled function: `gradients` of `loss_fn()`'s
    loss, then `flatten`ed with global-norm clip `clip` (0: no clip).

    Returns:
        (flat gradients `[P]` in the order of `variables`, loss, the loss_fn's aux).
    """
    grads, loss, aux = gradients(loss_fn, variables)
    return flatten(grads, clip), loss, aux


class CompiledGreedy:
    """Greedy acting through the agent's compiled `_greedy` (a batch of observations in,
    deterministic actions out, one fixed input signature)."""

    _greedy: Any  # a `compiled` function

    state_size: int = 0
    """Floats in one env's recurrent state; 0: a stateless policy (a `RecurrentAgent` built
    with `model.lstm` sets it)."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for a batch of observations (evaluation).

        Raises:
            EasyRLError: the policy is recurrent (`state_size` > 0): it acts with a state,
                through `greedy_policy(algo, recurrent=True)` (see `greedy_step`).
        """
        if self.state_size:
            raise EasyRLError(
                "a policy with model.lstm acts with a recurrent state: play it "
                "through easyrl.algorithms.agent_parts.greedy_policy(algo, recurrent=True)"
            )
        return self._greedy(np.asarray(obs, self._obs_dtype())).numpy()

    def greedy_step(self, obs: np.ndarray, state: np.ndarray, first: np.ndarray) -> tuple:
        """A recurrent policy's greedy step (its `_greedy` takes obs, state, first):
        (actions `[N]`, next state) for `obs` `[N, ...]`, the state and the episode-start
        flags `first` `[N]`."""
        state, first = np.asarray(state, np.float32), np.asarray(first, np.float32)
        action, next_state = self._greedy(np.asarray(obs, self._obs_dtype()), state, first)
        return action.numpy(), next_state.numpy()

    def _obs_dtype(self):
        return self._greedy.input_signature[0].dtype.as_numpy_dtype

    @property
    def greedy_fn(self) -> Compiled:
        """The compiled function `greedy` calls, with its fixed input signature (a batch of
        observations in, actions out); `easyrl export` saves it as a SavedModel."""
        return self._greedy


def greedy_policy(algo: Agent, recurrent: bool) -> EpisodicPolicy:
    """The deterministic policy evaluation plays on a vector of envs: `algo.greedy`, or for a
    `RecurrentAgent` (`recurrent`: built with `model.lstm`) a fresh `RecurrentGreedy` (zero
    state)."""
    if recurrent:
        return RecurrentGreedy(cast(RecurrentAgent, algo))
    return Stateless(algo.greedy)


class RecurrentGreedy:
    """A recurrent agent's greedy policy over one vector of envs, its state carried per env.

    Call it with the envs' observations; `end_episodes(done)` after each env step tells it
    which envs' episodes ended (same-step autoreset: their next observation starts a new
    episode, whose step starts from the zero state).

    Args:
        algo: the recurrent agent.
    """

    def __init__(self, algo: RecurrentAgent):
        self.algo = algo
        self._state: np.ndarray | None = None
        self._first: np.ndarray | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self._state is None or self._first is None or len(self._state) != len(obs):
            self._state = np.zeros((len(obs), self.algo.state_size), np.float32)
            self._first = np.ones(len(obs), np.float32)
        action, self._state = self.algo.greedy_step(obs, self._state, self._first)
        self._first = np.zeros(len(obs), np.float32)
        return action

    def end_episodes(self, done: np.ndarray) -> None:
        """Marks the envs whose episode ended on the last step: their state restarts."""
        if self._first is not None:
            self._first = np.maximum(self._first, np.asarray(done, np.float32).reshape(-1))


class NoTargetNetwork:
    """Base of a replay agent without a target network (IMPALA/A3C, LinUCB, MARWIL/BC): its
    `target_update_period` is 0, so the learner never syncs, and `sync_target` has nothing to
    copy."""

    target_update_period = 0
    """No target network: the runtime never syncs one."""

    def sync_target(self) -> None:
        """Nothing to copy: there is no target network."""


class FusesItsStep:
    """Base of an agent whose `learn` runs `self._step`, a `GradientStep`: a learner that
    applies its own updates takes the optimizer's step into that call (`fuse_update`,
    `contract.FusingLearner`; SAC overrides it to take its Polyak step too)."""

    _step: GradientStep

    def fuse_update(self, optimizer: LocalOptimizer) -> bool:
        """From now on `learn`'s compiled step applies its gradients with `optimizer` too
        (a learner that applies its own updates, `easyrl.roles.publisher`); returns False:
        a target network, if any, is still synced by `sync_target`."""
        return self._step.fuse(optimizer.traced())


def checked_columns(name: str, spec: dict, batch: dict) -> list[np.ndarray]:
    """The `spec` columns ({column: (per-item shape, dtype)}) of `batch`, in the spec's order
    and dtypes, all as long as the first.

    Raises:
        EasyRLError: a column is missing or has a wrong shape (the message starts with `name`).
    """
    missing = [c for c in spec if c not in batch]
    if missing:
        raise EasyRLError(f"{name} batch lacks columns {missing}")
    n, arrays = len(batch[next(iter(spec))]), []
    for column, (shape, dtype) in spec.items():
        array = np.asarray(batch[column], dtype)
        if array.shape != (n, *shape):
            raise EasyRLError(
                f"{name} batch column {column!r} must be {(n, *shape)}, got {array.shape}"
            )
        arrays.append(array)
    return arrays
