"""`easyrl rollout`: the greedy policy of a run's checkpoint, played on fresh environments.

The policy is loaded by `easyrl.policy.load_run` (through `easyrl.tools.checkpoints.load_policy`,
which rebuilds a run's algorithm and assigns a checkpoint's weights by name) and played through
`easyrl.policy.Policy.predict`, the Python API's policy (`easyrl.load`).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import NamedTuple

import gymnasium
import numpy as np

from easyrl.envs import evaluation_options, make_vector_env
from easyrl.envs.evaluation import play_episodes
from easyrl.errors import EasyRLError
from easyrl.policy import EpisodePlayer, load_run
from easyrl.seeds import derive_seed

__all__ = ["RolloutResult", "rollout"]


class RolloutResult(NamedTuple):
    """The episodes a rollout played, in the order they ended.

    Attributes:
        returns: the undiscounted return of each episode.
        lengths: the number of steps of each episode.
        checkpoint: "best" or "latest".
    """

    returns: list[float]
    lengths: list[int]
    checkpoint: str

    @property
    def mean(self) -> float:
        """The mean return (nan without episodes)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")


def _require_moviepy() -> None:
    """Raises EasyRLError naming what to install unless moviepy (which RecordVideo writes
    the files with) is importable."""
    try:
        importlib.import_module("moviepy")
    except ImportError as err:
        raise EasyRLError(
            "--video needs moviepy to write the video files: pip install moviepy "
            "(or pip install 'gymnasium[other]')"
        ) from err


def _video_env(cfg, options: dict, video_dir: Path, episodes: int, seed: int):
    """One environment rendering `rgb_array` frames, every episode recorded to `video_dir`
    by `gymnasium.wrappers.RecordVideo`, as a vector env of one."""
    options = {**options, "kwargs": {**options["kwargs"], "render_mode": "rgb_array"}}
    try:
        env = make_vector_env(cfg.env.id, 1, vector="sync", seed=seed, **options)
    except (gymnasium.error.Error, TypeError, ValueError) as err:
        raise EasyRLError(f"cannot make {cfg.env.id} with render_mode='rgb_array': {err}") from err
    assert isinstance(env, gymnasium.vector.SyncVectorEnv)  # what vector="sync" makes
    # The vector env steps the sub-env through `envs[0]`; wrapping it there keeps the
    # same vector loop (and Atari preprocessing) for recorded and unrecorded rollouts.
    # Stop at the last episode: the vector env resets once more after it ends.
    env.envs[0] = gymnasium.wrappers.RecordVideo(
        env.envs[0],
        str(video_dir),
        episode_trigger=lambda episode: episode < episodes,
        name_prefix="rollout",
    )
    return env


def rollout(
    run_dir: str | Path,
    episodes: int = 10,
    checkpoint: str | None = None,
    video_dir: str | Path | None = None,
    seed: int | None = None,
    quiet: bool = False,
) -> RolloutResult:
    """Plays a run's greedy (deterministic) policy for whole episodes on fresh environments.

    The environments are the run's (`env` section), Atari without episodic life or reward
    clipping (returns are game scores, as the evaluator's), `min(episodes, eval.num_envs)`
    of them stepped together, or a single one when recording video.

    Args:
        run_dir: the run directory (`config.yaml`, `checkpoints/`).
        episodes: how many episodes to play (at least 1).
        checkpoint: "best", "latest" or None: "best" when `checkpoints/best.npz` exists.
        video_dir: record every episode as a video into this directory (needs moviepy).
        seed: the seed of the first reset (None: the run's "rollout" seed stream, so a
            rollout plays neither an actor's nor the evaluator's episodes).
        quiet: print nothing (else one line per episode and the mean, on stdout).

    Returns:
        The episodes' returns and lengths and the checkpoint used.

    Raises:
        EasyRLError: `episodes` < 1, no run directory or checkpoint, a checkpoint that does
            not fit the config, or video recording without moviepy.
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise EasyRLError(f"episodes must be a positive int, got {episodes!r}")
    if video_dir is not None:
        _require_moviepy()
    policy = load_run(run_dir, checkpoint)
    cfg = policy.config
    assert cfg is not None  # a run's policy has its config
    out = None if quiet else sys.stdout
    seed = derive_seed(cfg.run.seed, "rollout") if seed is None else int(seed)
    options = evaluation_options(cfg.env)  # Atari: game scores, as the evaluator's
    if video_dir is not None:
        env = _video_env(cfg, options, Path(video_dir), episodes, seed)
    else:
        num_envs = min(episodes, cfg.eval.num_envs)
        env = make_vector_env(cfg.env.id, num_envs, vector="sync", seed=seed, **options)

    def report(index: int, ret: float, length: int) -> None:
        if out is not None:
            print(f"episode {index + 1}: return {ret:.1f}, length {length}", file=out, flush=True)

    if out is not None:
        files = ", ".join(policy.checkpoint_files)
        print(
            f"{cfg.algorithm.name} on {cfg.env.id}, {policy.checkpoint} checkpoint ({files}): "
            f"{episodes} episode(s)",
            file=out,
        )
    try:
        returns, lengths = play_episodes(
            env, EpisodePlayer(policy), episodes, seed, on_episode=report
        )
    except gymnasium.error.DependencyNotInstalled as err:  # rendering for --video
        raise EasyRLError(f"{cfg.env.id} needs a package that is not installed: {err}") from err
    finally:
        env.close()
    result = RolloutResult(returns, lengths, policy.checkpoint)
    if out is not None:
        print(
            f"mean return {result.mean:.1f} over {episodes} episode(s) "
            f"(std {np.std(result.returns):.1f}, mean length {np.mean(result.lengths):.1f})",
            file=out,
        )
        if video_dir is not None:
            print(f"videos in {Path(video_dir).resolve()}", file=out)
    return result
