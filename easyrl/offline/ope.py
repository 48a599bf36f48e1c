"""Off-policy evaluation: the value of a target policy pi estimated from episodes logged by
a behaviour policy mu (Precup et al. 2000), trajectory-wise:

    w_i   = prod_t pi(a_t | s_t) / mu(a_t | s_t)       (episode i's importance weight)
    G_i   = sum_t gamma^t r_t                           (episode i's discounted return)
    IS    = (1 / n) sum_i w_i G_i                       (unbiased, high variance)
    WIS   = sum_i w_i G_i / sum_i w_i                   (biased, consistent, bounded by the G_i)

Weights are computed in log space (sums of log-ratios); WIS divides by the largest weight
first, so it stays finite even when every weight underflows or overflows. Long episodes make
w_i extreme (a product over hundreds of steps): trust WIS more than IS there.

`OffPolicyEvaluator` is the evaluator's side: it keeps a fixed sample of the input
dataset's episodes and estimates the learned policy's (undiscounted, like evaluation
returns) value on them after every evaluation.
"""

import logging
from typing import NamedTuple

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec
from easyrl.offline.dataset import episode_bounds, read_steps

log = logging.getLogger(__name__)


class LoggedEpisode(NamedTuple):
    """One logged episode: per-step rewards and both policies' log-probabilities `[T]`."""

    rewards: np.ndarray
    behaviour_logp: np.ndarray
    target_logp: np.ndarray


def _weights_and_returns(episodes, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(log w_i, G_i) of every episode, float64."""
    if not episodes:
        raise ValueError("off-policy evaluation needs at least one episode")
    log_w, returns = [], []
    for e in episodes:
        r = np.asarray(e.rewards, np.float64)
        if not len(r) == len(e.behaviour_logp) == len(e.target_logp):
            raise ValueError("rewards and log-probabilities of an episode differ in length")
        log_w.append(np.sum(np.asarray(e.target_logp, np.float64) - e.behaviour_logp))
        returns.append(np.sum(r * gamma ** np.arange(len(r))))
    return np.array(log_w), np.array(returns)


def importance_sampling(episodes: list[LoggedEpisode], gamma: float = 1.0) -> float:
    """The trajectory-wise importance sampling estimate (see the module docstring)."""
    log_w, returns = _weights_and_returns(episodes, gamma)
    return float(np.mean(np.exp(log_w) * returns))


def weighted_importance_sampling(episodes: list[LoggedEpisode], gamma: float = 1.0) -> float:
    """The weighted importance sampling estimate (see the module docstring); the mean
    return when every weight is zero (the target never takes a logged action sequence)."""
    log_w, returns = _weights_and_returns(episodes, gamma)
    if np.all(np.isneginf(log_w)):
        return float(np.mean(returns))
    w = np.exp(log_w - np.max(log_w))  # the largest weight is 1
    return float(np.sum(w * returns) / np.sum(w))


class OffPolicyEvaluator:
    """Estimates a target policy's value on a fixed sample of a dataset's episodes.

    Args:
        steps: rows of `read_steps` (sorted, whole episodes) holding `action_logp`.
        episodes: how many episodes to keep (a seeded random sample; all when fewer).
        seed: seed of the sample.
        gamma: discount of the estimated value (1: undiscounted, like evaluation returns).
    """

    def __init__(self, steps: dict, episodes: int, seed: int = 0, gamma: float = 1.0):
        if "action_logp" not in steps:
            raise ValueError("the dataset has no action_logp column (behaviour probabilities)")
        bounds = episode_bounds(steps).tolist()
        count = len(bounds) - 1
        chosen = np.sort(np.random.default_rng(seed).permutation(count)[:episodes])
        rows = np.concatenate([np.arange(bounds[j], bounds[j + 1]) for j in chosen])
        self.steps = {k: v[rows] for k, v in steps.items()}
        self.bounds = episode_bounds(self.steps)
        self.gamma = gamma

    @classmethod
    def from_config(cls, cfg, spec: AlgorithmSpec) -> "OffPolicyEvaluator | None":
        """The evaluator's estimator for an offline run of the algorithm `spec` declares, or
        None (no `input.dir`, `input.ope_episodes: 0`, no `action_logp` in the spec (its
        agents are no `LogpAgent`s) or in the dataset)."""
        if cfg.input.dir is None or cfg.input.ope_episodes == 0:
            return None
        if not spec.action_logp:
            log.info("no off-policy evaluation: %s has no action_logp", cfg.algorithm.name)
            return None
        steps = read_steps(cfg.input.dir)
        if "action_logp" not in steps:
            log.info("no off-policy evaluation: the dataset has no behaviour probabilities")
            return None
        return cls(steps, cfg.input.ope_episodes, cfg.run.seed)

    def estimate(self, action_logp) -> dict[str, float]:
        """IS and WIS estimates of the policy whose log-probabilities
        `action_logp(obs, actions) -> [rows]` gives, as `eval_ope_is` / `eval_ope_wis`."""
        target = np.asarray(action_logp(self.steps["obs"], self.steps["action"]), np.float64)
        steps, b = self.steps, self.bounds
        episodes = [
            LoggedEpisode(steps["reward"][lo:hi], steps["action_logp"][lo:hi], target[lo:hi])
            for lo, hi in zip(b[:-1], b[1:])
        ]
        return {
            "eval_ope_is": importance_sampling(episodes, self.gamma),
            "eval_ope_wis": weighted_importance_sampling(episodes, self.gamma),
            "eval_ope_episodes": float(len(episodes)),
        }
