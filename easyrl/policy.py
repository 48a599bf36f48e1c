"""`easyrl.load(PATH)`: the greedy policy of a run directory or of an export, in Python.

    import easyrl

    policy = easyrl.load("runs/cartpole-ppo-20261127-101500")  # or an `easyrl export` directory
    action, _ = policy.predict(obs)                              # one observation
    actions, _ = policy.predict(obs_batch)                       # a batch [N, *obs_shape]

`predict(obs, state=None, episode_start=None, deterministic=True)` answers as
Stable-Baselines3's `model.predict` does: `(actions, state)`, the actions of one observation
or of a batch. Observations are what easyrl's environments observe (Atari: the preprocessed
frames). A Dict or Tuple observation may be given as the gymnasium env returns it (one, a
list of them, or a vector env's Dict of batched arrays): it is flattened as every env easyrl
builds flattens it (`easyrl.envs.flat`), its `action_mask` included, so the policy never takes
a masked action; the flat vector is accepted too.

A recurrent policy (`model.lstm`) carries its state `[N, state_size]` (one observation:
`[state_size]`), as the agent and the SavedModel carry it:

    state, starts = None, np.ones(num_envs, bool)
    while True:
        actions, state = policy.predict(obs, state=state, episode_start=starts)
        obs, _, terminated, truncated, _ = envs.step(actions)
        starts = terminated | truncated

`state=None` is the initial state (every episode starts); passing back the returned state
continues the episodes; `episode_start` (SB3's name) marks the envs whose observation starts
a new episode: their state restarts from the initial one. A policy without a state returns
None as its state.

A run directory is loaded as `easyrl rollout` loads it (`easyrl.tools.checkpoints.load_policy`:
`checkpoints/best.npz` when it exists, else the PS checkpoints) and acts with the agent's
compiled greedy function; an export (`easyrl export`) is loaded with `tf.saved_model.load` and
acts through its `action` signature, which serves that same function. `easyrl rollout` plays
its episodes through `predict` (`EpisodePlayer`). Only the greedy (deterministic) policy is
loaded: `deterministic=False` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from easyrl import config as config_lib
from easyrl.algorithms.contract import RecurrentAgent
from easyrl.envs import env_options, env_spaces
from easyrl.envs.flat import FlatBox, flatten_observation
from easyrl.errors import EasyRLError
from easyrl.tfimport import import_tensorflow_quietly
from easyrl.tools.checkpoints import load_policy, run_config
from easyrl.tools.export import EXPORT_INFO, SIGNATURE

__all__ = ["EpisodePlayer", "Policy", "load", "load_run"]

Act = Callable[[np.ndarray, np.ndarray | None, np.ndarray], tuple[np.ndarray, np.ndarray | None]]
"""A batch's greedy step: (obs `[N, ...]`, state `[N, S]` or None, episode starts `[N]`) ->
(actions `[N, ...]`, next state or None)."""


class Policy:
    """The greedy policy of a run or an export; `easyrl.load` makes one.

    Attributes:
        path: the run or export directory it was loaded from.
        algorithm: the algorithm's name (`algorithm.name`).
        env_id: the environment it was trained on.
        checkpoint: which weights: "best" or "latest" (an export: those it was made from).
        checkpoint_files: the names of the checkpoint files the weights came from.
        config: the run's config (an export: the config it keeps, or None).
        state_size: the width of the recurrent state per env (0: no state).
        observation_shape: the shape of one observation as the network takes it.
    """

    def __init__(
        self,
        act: Act,
        *,
        path: Path,
        algorithm: str,
        env_id: str,
        checkpoint: str,
        checkpoint_files: list[str],
        config: config_lib.Config | None,
        state_size: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        flat_space: FlatBox | None,
    ):
        self._act = act
        self.path = path
        self.algorithm = algorithm
        self.env_id = env_id
        self.checkpoint = checkpoint
        self.checkpoint_files = checkpoint_files
        self.config = config
        self.state_size = state_size
        self.observation_shape = obs_shape
        self._obs_dtype = obs_dtype
        self._flat = flat_space  # a Dict/Tuple env's: raw observations are flattened by it

    def __repr__(self) -> str:
        state = f", recurrent state {self.state_size}" if self.state_size else ""
        return (
            f"Policy({self.algorithm} on {self.env_id}, {self.checkpoint} weights of "
            f"{str(self.path)!r}{state})"
        )

    def predict(
        self,
        obs: Any,
        state: np.ndarray | None = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Greedy actions for one observation or a batch (see the module docstring).

        Args:
            obs: one observation, or a batch `[N, *observation_shape]`; a Dict/Tuple env's as
                the env returns them (or flat).
            state: a recurrent policy's state as the previous call returned it; None: the
                initial state. Must be None for a policy without a state.
            episode_start: bools `[N]` (one observation: a bool): whose episode starts with
                this observation (its state restarts); None: none (or all, with `state` None).
            deterministic: must be True: the greedy policy is what is loaded.

        Returns:
            (actions `[N, ...]`, or one observation's action; the next state `[N, state_size]`
            or `[state_size]`, or None without a state).

        Raises:
            EasyRLError: an observation, state or episode_start of the wrong shape, an
                observation that does not fit the env's, a state for a policy without one,
                or `deterministic=False`.
        """
        if not deterministic:
            raise EasyRLError(
                "predict: deterministic=False is not supported: easyrl loads the greedy "
                "policy (rollout's, the export's), not the behaviour policy of the actors"
            )
        batch, single = self._batch(obs)
        n = len(batch)
        starts = _episode_starts(episode_start, n, single)
        if not self.state_size:
            if state is not None:
                raise EasyRLError(
                    f"predict: this {self.algorithm} policy has no recurrent state (no "
                    "model.lstm); pass state=None"
                )
        elif state is None:
            state, starts = np.zeros((n, self.state_size), np.float32), np.ones(n, np.float32)
        else:
            state = self._check_state(state, n, single)
        actions, state = self._act(batch, state, starts)
        if single:
            return actions[0], None if state is None else state[0]
        return actions, state

    def _batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        """(observations `[N, *observation_shape]` in the network's dtype, whether `obs` was
        one observation)."""
        if _structured(obs, self._flat.features if self._flat is not None else None):
            if self._flat is None:
                raise EasyRLError(
                    f"predict: got a {type(obs).__name__} observation, but {self.env_id} "
                    f"observes arrays of shape {self.observation_shape}"
                    + (" (or this export keeps no config.yaml)" if self.config is None else "")
                )
            return self._flatten(obs)
        array = np.asarray(obs)
        shape = self.observation_shape
        if array.shape == shape:
            return np.asarray(array[None], self._obs_dtype), True
        if array.shape[1:] == shape and array.ndim == len(shape) + 1:
            return np.asarray(array, self._obs_dtype), False
        raise EasyRLError(
            f"predict: expected one observation of shape {shape} or a batch [N, "
            f"{', '.join(map(str, shape))}], got an array of shape {array.shape}"
        )

    def _flatten(self, obs: Any) -> tuple[np.ndarray, bool]:
        """Raw Dict/Tuple observations (one, a list, or batched arrays) as flat vectors."""
        space = self._flat
        assert space is not None and space.features is not None
        if isinstance(obs, list):
            rows, single = obs, False
        elif _batched(space.features, obs):
            count = len(np.asarray(_first_leaf(space.features, obs)[1]))
            rows, single = [_row(obs, i) for i in range(count)], False
        else:
            rows, single = [obs], True
        try:
            flat = np.stack([flatten_observation(space, row) for row in rows])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise EasyRLError(
                f"predict: the observation does not fit {self.env_id}'s observation space "
                f"{space.features}: {type(err).__name__}: {err}"
            ) from err
        return flat, single

    def _check_state(self, state: Any, n: int, single: bool) -> np.ndarray:
        """`state` as float32 `[n, state_size]`."""
        state = np.asarray(state, np.float32)
        if single and state.shape == (self.state_size,):
            state = state[None]
        if state.shape != (n, self.state_size):
            raise EasyRLError(
                f"predict: state must be [{n}, {self.state_size}] (what predict returned for "
                f"these observations), got shape {state.shape}"
            )
        return state


def _structured(obs: Any, features: spaces.Space | None) -> bool:
    """Whether `obs` is a raw Dict observation (or a Tuple one, for a Tuple env's `features`),
    or a list of them."""
    if isinstance(obs, list) and obs:
        obs = obs[0]
    return isinstance(obs, Mapping) or (isinstance(features, spaces.Tuple) and type(obs) is tuple)


def _first_leaf(space: spaces.Space, obs: Any) -> tuple[spaces.Space, Any]:
    """The first leaf (a non-Dict, non-Tuple part) of a structured observation and its space."""
    while isinstance(space, spaces.Dict | spaces.Tuple):
        if isinstance(space, spaces.Dict):
            key = next(iter(space.spaces))
            space, obs = space.spaces[key], obs[key]
        else:
            space, obs = space.spaces[0], obs[0]
    return space, obs


def _batched(features: spaces.Space, obs: Any) -> bool:
    """Whether a structured observation holds a batch: its leaves have one more dimension
    than their spaces (a gymnasium vector env's Dict of arrays)."""
    try:
        space, leaf = _first_leaf(features, obs)
    except (KeyError, IndexError, TypeError) as err:
        raise EasyRLError(f"predict: the observation does not fit {features}: {err}") from err
    return np.ndim(leaf) == len(space.shape or ()) + 1


def _row(obs: Any, i: int) -> Any:
    """Observation `i` of a structured batch."""
    if isinstance(obs, Mapping):
        return {key: _row(value, i) for key, value in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(value, i) for value in obs)
    return np.asarray(obs)[i]


def _episode_starts(episode_start: Any, n: int, single: bool) -> np.ndarray:
    """`episode_start` as float32 flags `[n]` (None: zeros)."""
    if episode_start is None:
        return np.zeros(n, np.float32)
    starts = np.asarray(episode_start, np.float32).reshape(-1)
    if starts.shape != (n,):
        expected = "a bool" if single else f"{n} flags"
        raise EasyRLError(f"predict: episode_start must be {expected}, got {episode_start!r}")
    return starts


def load(path: str | Path, checkpoint: str | None = None) -> Policy:
    """Loads the greedy policy of a run directory or of an `easyrl export` directory.

    Args:
        path: a run directory (`config.yaml`, `checkpoints/`) or an export directory
            (`easyrl_export.json`, the SavedModel).
        checkpoint: a run's "best" (`checkpoints/best.npz`), "latest" (the PS checkpoints)
            or None: "best" when it exists; None for an export.

    Returns:
        The Policy (see `Policy.predict`).

    Raises:
        EasyRLError: `path` is neither a run nor an export, a run without the checkpoint, a
            checkpoint that does not fit the run's config, a multi-agent run, or a
            `checkpoint` given for an export.
        ConfigError: the run's (or the export's) config.yaml is invalid.
    """
    path = Path(path)
    if (path / EXPORT_INFO).is_file():
        if checkpoint is not None:
            raise EasyRLError(
                f"{str(path)!r} is an export: it holds the weights it was exported with; "
                "give no checkpoint"
            )
        return _load_export(path)
    if path.is_dir() and not (path / "config.yaml").is_file():
        raise EasyRLError(
            f"{str(path)!r} is neither a run directory (it has no config.yaml) nor an "
            f"export (no {EXPORT_INFO})"
        )
    return load_run(path, checkpoint)


def load_run(run_dir: str | Path, checkpoint: str | None = None) -> Policy:
    """The Policy of a run directory (see `load`), acting with the agent `load_policy`
    rebuilds."""
    loaded = load_policy(run_dir, checkpoint)
    agent = loaded.algo
    spec = agent.greedy_fn.input_signature[0]
    # Built with model.lstm: a RecurrentAgent (the contract), as greedy_policy reads it too.
    state_size = cast(RecurrentAgent, agent).state_size if loaded.cfg.model.lstm else 0

    def act(obs, state, starts):
        if state is None:
            return agent.greedy(obs), None
        return agent.greedy_step(obs, state, starts)

    flat = loaded.obs_space if isinstance(loaded.obs_space, FlatBox) else None
    return Policy(
        act,
        path=Path(run_dir),
        algorithm=loaded.cfg.algorithm.name,
        env_id=loaded.cfg.env.id,
        checkpoint=loaded.checkpoint,
        checkpoint_files=[p.name for p in loaded.files],
        config=loaded.cfg,
        state_size=state_size,
        obs_shape=tuple(spec.shape[1:]),
        obs_dtype=spec.dtype.as_numpy_dtype,
        flat_space=flat,
    )


def _load_export(path: Path) -> Policy:
    """The Policy of an export directory, acting through its `action` signature."""
    import_tensorflow_quietly()
    import tensorflow as tf

    info = json.loads((path / EXPORT_INFO).read_text())
    try:
        model = tf.saved_model.load(str(path))
    except (OSError, ValueError) as err:
        raise EasyRLError(f"cannot load the SavedModel in {str(path)!r}: {err}") from err
    spec = model.signatures[SIGNATURE].structured_input_signature[1]["obs"]
    state_size = int(info["state"]["shape"][1]) if "state" in info else 0

    def act(obs, state, starts):
        signature = model.signatures[SIGNATURE]  # (the variables live as long as `model`)
        if state is None:
            return signature(obs=tf.constant(obs))[SIGNATURE].numpy(), None
        state = state * (1.0 - starts)[:, None]  # [N, S]: an episode start's is the initial
        out = signature(obs=tf.constant(obs), state=tf.constant(state))
        return out[SIGNATURE].numpy(), out["state"].numpy()

    config, flat = None, None
    if (path / "config.yaml").is_file():
        config = run_config(path)
        if info["observation_space"]["type"] == FlatBox.__name__:  # Dict/Tuple observations
            flat = env_spaces(config.env.id, **env_options(config.env))[0]
    return Policy(
        act,
        path=path,
        algorithm=info["algorithm"],
        env_id=info["env_id"],
        checkpoint=info["checkpoint"],
        checkpoint_files=list(info["checkpoint_files"]),
        config=config,
        state_size=state_size,
        obs_shape=tuple(spec.shape[1:]),
        obs_dtype=spec.dtype.as_numpy_dtype,
        flat_space=flat if isinstance(flat, FlatBox) else None,
    )


class EpisodePlayer:
    """`policy.predict` over a vector of envs, for `easyrl.envs.evaluation.play_episodes`: it
    carries a recurrent policy's state per env and restarts it where `end_episodes` says an episode
    ended (same-step autoreset: the next observation starts a new one). `easyrl rollout`
    plays with it."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._state: np.ndarray | None = None
        self._starts: np.ndarray | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        actions, self._state = self.policy.predict(obs, self._state, self._starts)
        self._starts = np.zeros(len(actions), bool)
        return actions

    def end_episodes(self, done: np.ndarray) -> None:
        """Marks the envs whose episode ended on the last step."""
        if self._starts is not None:
            self._starts = self._starts | np.asarray(done, bool).reshape(-1)
