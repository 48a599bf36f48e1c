"""`easyrl export`: a run's greedy policy as a TensorFlow SavedModel.

The SavedModel needs nothing but TensorFlow to run:

    policy = tf.saved_model.load(DIR)
    actions = policy.signatures["action"](obs=tf.constant(obs_batch))["action"]

`obs` is a batch `[N, *obs_shape]` in the dtype the model takes (float32 for MLPs, uint8 for
Atari frames); `action` is `[N]` int64 (Discrete) or `[N, A]` float32 (Box, already scaled to
the env's bounds). `DIR/easyrl_export.json` describes both for humans; `DIR/config.yaml` is
the run's config, by which `easyrl.load(DIR)` flattens Dict observations as the run's envs do.

The exported function is the agent's own compiled greedy function (`agent.greedy_fn`, the
one `agent.greedy` calls), so the SavedModel computes the same actions as `easyrl rollout`.

A recurrent policy (`model.lstm` > 0) carries its state, as TF-Agents' policy saver does:

    state = policy.signatures["get_initial_state"](batch_size=tf.constant(N))["state"]
    out = policy.signatures["action"](obs=tf.constant(obs_batch), state=state)
    actions, state = out["action"], out["state"]

The caller passes the initial (zero) state for an env whose episode starts, and the returned
state otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np

from easyrl.errors import EasyRLError
from easyrl.tools.checkpoints import load_policy

__all__ = ["EXPORT_INFO", "SIGNATURE", "describe_space", "export"]

SIGNATURE = "action"
"""The serving signature's name (and its output's); its input is named `obs`."""

EXPORT_INFO = "easyrl_export.json"
"""The description written next to the SavedModel."""


def describe_space(space) -> dict:
    """A gymnasium space as plain JSON data (type, shape, dtype, bounds or size)."""
    import gymnasium

    info = {"type": type(space).__name__, "shape": list(space.shape or ())}
    if space.dtype is not None:
        info["dtype"] = np.dtype(space.dtype).name
    if isinstance(space, gymnasium.spaces.Discrete):
        info.update(n=int(space.n), start=int(space.start))
    elif isinstance(space, gymnasium.spaces.Box) and space.low.size <= 64:
        info.update(low=_bounds(space.low), high=_bounds(space.high))
    return info


def _bounds(values: np.ndarray) -> list:
    """Box bounds as JSON numbers, infinite ones as the strings "inf" / "-inf" (JSON has
    no infinity)."""
    return [float(v) if np.isfinite(v) else str(float(v)) for v in values.ravel()]


def _policy_module(greedy_fn, variables: list):
    """A `tf.Module` that tracks `variables` (so the SavedModel stores them) and serves
    `greedy_fn` as `action(obs) -> {"action": actions}`; a recurrent one (`greedy_fn(obs,
    state, first)`) as `action(obs, state) -> {"action", "state"}`, with
    `get_initial_state(batch_size) -> {"state"}`."""
    import tensorflow as tf

    spec = greedy_fn.input_signature[0]
    if len(greedy_fn.input_signature) == 3:
        state_spec = greedy_fn.input_signature[1]
        return _recurrent_module(greedy_fn, variables, spec, int(state_spec.shape[1]))

    class Policy(tf.Module):
        """The greedy policy of an easyrl run (see `easyrl.tools.export`)."""

        def __init__(self):
            super().__init__(name="easyrl_policy")
            self.policy_variables = variables

        @tf.function(input_signature=[tf.TensorSpec(spec.shape, spec.dtype, name="obs")])
        def action(self, obs):
            """Greedy actions for a batch of observations."""
            return {SIGNATURE: greedy_fn(obs)}

    return Policy()


def _recurrent_module(greedy_fn, variables: list, spec, state_size: int):
    """`_policy_module` of a recurrent greedy function (see the module docstring)."""
    import tensorflow as tf

    class RecurrentPolicy(tf.Module):
        """The greedy recurrent policy of an easyrl run (see `easyrl.tools.export`)."""

        def __init__(self):
            super().__init__(name="easyrl_policy")
            self.policy_variables = variables

        @tf.function(input_signature=[tf.TensorSpec([], tf.int32, name="batch_size")])
        def get_initial_state(self, batch_size):
            """The state of envs whose episode starts: zeros `[batch_size, state]`."""
            return {"state": tf.zeros([batch_size, state_size], tf.float32)}

        @tf.function(
            input_signature=[
                tf.TensorSpec(spec.shape, spec.dtype, name="obs"),
                tf.TensorSpec([None, state_size], tf.float32, name="state"),
            ]
        )
        def action(self, obs, state):
            """Greedy actions and the next state for a batch of observations and states."""
            first = tf.zeros([tf.shape(obs)[0]], tf.float32)  # the caller resets the state
            actions, state = greedy_fn(obs, state, first)
            return {SIGNATURE: actions, "state": state}

    return RecurrentPolicy()


SAVE_LOGGERS = ("tensorflow", "absl")
"""The loggers TensorFlow reports saving through at INFO ("input name(s) ... will be renamed",
"Assets written to"): notices about its own internals, kept below WARNING while exporting."""


@contextlib.contextmanager
def _quiet_save():
    """Within it, `SAVE_LOGGERS` pass only warnings and errors; their levels are restored."""
    loggers = [logging.getLogger(name) for name in SAVE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.level, logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _check_out(out: Path) -> None:
    """Refuses to write into an existing file or a non-empty directory other than an
    earlier export (which is replaced)."""
    if out.exists() and not out.is_dir():
        raise EasyRLError(f"--out {str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_INFO).is_file():
        raise EasyRLError(
            f"--out {str(out)!r} is a non-empty directory that holds no earlier export; "
            "choose a new directory"
        )


def export(run_dir: str | Path, out: str | Path, checkpoint: str | None = None) -> Path:
    """Saves a run's greedy policy as a SavedModel with an `action` serving signature.

    Args:
        run_dir: the run directory (`config.yaml`, `checkpoints/`).
        out: the SavedModel directory to write (new, empty, or an earlier export).
        checkpoint: "best", "latest" or None: "best" when `checkpoints/best.npz` exists.

    Returns:
        `out`, as a Path.

    Raises:
        EasyRLError: no run directory or checkpoint, a checkpoint that does not fit the
            config, or an unusable `out`.
    """
    out = Path(out)
    _check_out(out)
    loaded = load_policy(run_dir, checkpoint)  # imports TensorFlow once the run is known good
    import tensorflow as tf

    algo, cfg = loaded.algo, loaded.cfg
    greedy_fn = algo.greedy_fn  # every agent has one (easyrl.algorithms.contract.Agent)
    # Every variable the greedy function reads must be tracked by the module: the PS ones,
    # and any other the agent reads (none today).
    variables = list(algo.variables.values())
    known = {id(v) for v in variables}
    captured = greedy_fn.get_concrete_function().variables
    variables += [v for v in captured if id(v) not in known]
    with tf.device("/CPU:0"):
        module = _policy_module(greedy_fn, variables)
        signatures: dict = {SIGNATURE: module.action}
        initial_state = getattr(module, "get_initial_state", None)  # a recurrent policy's
        if initial_state is not None:
            signatures["get_initial_state"] = initial_state
        with _quiet_save():
            tf.saved_model.save(module, str(out), signatures=signatures)
    spec = greedy_fn.input_signature[0]
    info = {
        "algorithm": cfg.algorithm.name,
        "env_id": cfg.env.id,
        "run_dir": str(Path(run_dir).resolve()),
        "checkpoint": loaded.checkpoint,
        "checkpoint_files": [p.name for p in loaded.files],
        "signature": SIGNATURE,
        "input": {"name": "obs", "shape": spec.shape.as_list(), "dtype": spec.dtype.name},
        "output": {"name": SIGNATURE, **_output_spec(module)},
        "observation_space": describe_space(loaded.obs_space),
        "action_space": describe_space(loaded.action_space),
        "usage": (
            f"tf.saved_model.load(DIR).signatures[{SIGNATURE!r}](obs=tf.constant(batch))"
            f"[{SIGNATURE!r}]"
        ),
    }
    if len(greedy_fn.input_signature) == 3:
        state = greedy_fn.input_signature[1].shape.as_list()
        info["state"] = {"name": "state", "shape": state, "dtype": "float32"}
        info["usage"] = (
            "state = policy.signatures['get_initial_state'](batch_size=tf.constant(N))"
            f"['state']; out = policy.signatures[{SIGNATURE!r}](obs=tf.constant(batch), "
            f"state=state); out[{SIGNATURE!r}], out['state'] (policy = "
            "tf.saved_model.load(DIR); pass the initial state where an episode starts)"
        )
    shutil.copyfile(Path(run_dir) / "config.yaml", out / "config.yaml")
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=2, allow_nan=False) + "\n")
    return out


def _output_spec(module) -> dict:
    """The shape and dtype of the served actions."""
    output = module.action.get_concrete_function().structured_outputs[SIGNATURE]
    return {"shape": output.shape.as_list(), "dtype": output.dtype.name}
