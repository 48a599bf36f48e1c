"""The actor's side of `output:`: records the steps the actor takes into a dataset.

Recording starts once the actor's own trailing mean episode return (over its last
`stop.window` finished episodes) reaches `output.min_return_mean` (immediately when that is
null), always at episode starts: only whole episodes are recorded. With `output.max_steps`,
actor i of N records its share (`max_steps // N`, one more for the first `max_steps % N`
actors), rounded up to whole episodes, then writes its last shard and stops recording; PS
shard 0 stops the run once the actors together wrote `max_steps` steps (`metrics.stop_reason`).
"""

import collections
import logging

import numpy as np

import easyrl
from easyrl.offline.dataset import DatasetWriter, make_schema

log = logging.getLogger(__name__)


class Recorder:
    """Records one actor's steps (see the module docstring).

    Args:
        cfg: the run's config (`output.dir` set).
        actor: this actor's index.
        num_actors: actors in the run.
        run_dir: the run directory (noted in the schema's `written_by`).
        obs_space, action_space: one env's spaces.
    """

    def __init__(self, cfg, actor: int, num_actors: int, run_dir, obs_space, action_space):
        out = cfg.output
        self.cfg, self.actor, self.run_dir = cfg, actor, run_dir
        self.spaces = (obs_space, action_space)
        self.num_envs = cfg.env.num_envs
        self.share = None
        if out.max_steps is not None:
            self.share = out.max_steps // num_actors + int(actor < out.max_steps % num_actors)
        self.active = out.min_return_mean is None
        self.done = self.share == 0
        self._returns = collections.deque(maxlen=cfg.stop.window)
        self._running = np.zeros(self.num_envs)
        self._at_start = np.ones(self.num_envs, bool)  # the next step starts an episode
        self.recorded = 0  # steps of the finished recorded episodes
        self.writer: DatasetWriter | None = None

    def _start_writer(self, with_logp: bool) -> DatasetWriter:
        written_by = {
            "easyrl": easyrl.__version__,
            "algorithm": self.cfg.algorithm.name,
            "run_dir": str(self.run_dir),
        }
        schema = make_schema(self.cfg.env.id, *self.spaces, with_logp, written_by)
        out = self.cfg.output
        return DatasetWriter(out.dir, self.actor, self.num_envs, schema, out.max_file_mb)

    def step(self, obs, actions, rewards, terminated, truncated, next_obs, action_logp) -> None:
        """Records one vector step (`next_obs`: the true successors) when recording."""
        done = np.asarray(terminated) | np.asarray(truncated)
        if self.active and not self.done:
            if self.writer is None:
                self.writer = self._start_writer(action_logp is not None)
            self.writer.open_episodes(self._at_start)
            self.recorded += self.writer.add(
                obs, actions, rewards, terminated, truncated, next_obs, action_logp
            )
            if self.share is not None and self.recorded >= self.share:
                self.writer.close()
                self.done = True
                log.info("recorded %d steps (this actor's share); recording stops", self.recorded)
        self._running += rewards
        self._returns.extend(self._running[done].tolist())
        self._running[done] = 0.0
        self._at_start = done
        target = self.cfg.output.min_return_mean
        if not self.active and len(self._returns) == self._returns.maxlen:
            mean = np.mean(self._returns)
            if mean >= target:
                self.active = True
                log.info("trailing mean return %.1f >= %g: recording", mean, target)

    def reset(self) -> None:
        """The envs were reset: drops the open episodes; every env starts a new one."""
        if self.writer is not None:
            for env in range(self.num_envs):
                self.writer.discard(env)
        self._running[:] = 0.0
        self._at_start[:] = True

    def stats(self) -> dict[str, float]:
        """Recording state for the actor's report (`<task>/recorded_steps`: steps on disk)."""
        counters = self.writer.counters if self.writer is not None else {}
        return {
            "recording": float(self.active and not self.done),
            f"{self.actor}/recorded_steps": float(counters.get("written_steps", 0)),
            "dropped_open_steps": float(counters.get("dropped_open_steps", 0)),
        }

    def close(self) -> None:
        """Writes what is buffered (shutdown, SIGTERM); open episodes are dropped."""
        if self.writer is not None and not self.done:
            self.writer.close()
            log.info("recorder closed: %s", self.writer.counters)
