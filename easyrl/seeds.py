"""One way to derive the seeds of a run's random streams from `run.seed`, and what a seed
promises.

Without `run.deterministic`, `run.seed` fixes every random stream of a run: the initial
weights, each actor's env seeds and action noise, each learner's minibatch order, each
memory shard's sampling. What it cannot fix is timing: which weights an actor acts with,
which items a sample finds in the table and how reports fall into metrics rows depend on how
the processes interleave, so two runs of one seed start alike and then drift apart.

`run.deterministic: true` removes the timing where the flow allows it: synchronous rounds
(PPO, ES) with one actor and one learner (no evaluator), whose data per round is fixed by
the round's weights. Each TensorFlow process runs with op determinism and a seeded global
generator (`make_deterministic`), the actor reports a round before shipping it, the learner
reports a round before publishing the next, and PS shard 0 writes one metrics row per round,
taken before the actors go on, instead of one every `run.log_interval_s`. Two such runs write
the same rows, except `time_s`, the rates (`*_per_s`) and the Pull counts (`ps/<i>/pulls`:
how often the actor's long poll for the next round timed out).
"""

import numpy as np

from easyrl.errors import ConfigError

STREAMS = ("actor", "memory", "learner", "evaluator", "rollout", "policy", "slot")
"""The random streams of a run: one per role that draws random numbers, `easyrl rollout`,
and a multi-agent run's policies' initial values and its slots' collectors."""


def derive_seed(run_seed: int, stream: str, *index: int) -> int:
    """The seed of random stream `stream` for instance `index` (a task, an evaluation), drawn
    from `run_seed` so that no two streams or instances share a seed: the top 31 bits of
    `SeedSequence([run_seed mod 2**64, stream's number, *index])`. A vector env seeds sub-env
    i with `seed + i`, which 31 bits leave room for.

    Raises:
        ValueError: `stream` is not one of `STREAMS`.
    """
    if stream not in STREAMS:
        raise ValueError(f"unknown random stream {stream!r}; known: {', '.join(STREAMS)}")
    entropy = [run_seed % 2**64, STREAMS.index(stream), *index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0] >> 1)


def check_deterministic(cfg, flow: str) -> None:
    """Refuses `run.deterministic: true` where a run cannot repeat exactly (see the module
    docstring); `flow` is the algorithm's execution flow.

    Raises:
        ConfigError: an asynchronous flow, more than one actor, or an evaluator (whose
            evaluations run on a timer).
    """
    if not cfg.run.deterministic:
        return
    name = cfg.algorithm.name
    if flow != "sync_rounds":
        raise ConfigError(
            f"run.deterministic: {name} runs the {flow} flow, in which actors and learners "
            "interleave by timing; only synchronous rounds (ppo, es) repeat exactly. Set "
            "run.deterministic: false (run.seed still fixes every random stream)"
        )
    if cfg.cluster.actor != 1:
        raise ConfigError(
            f"run.deterministic: needs cluster.actor: 1 (several actors' items reach a round "
            f"in the order they arrive), got cluster.actor: {cfg.cluster.actor}"
        )
    if cfg.cluster.evaluator:
        raise ConfigError(
            "run.deterministic: needs cluster.evaluator: 0 (evaluations run on a timer), got "
            f"cluster.evaluator: {cfg.cluster.evaluator}"
        )


def make_deterministic(seed: int) -> None:
    """Makes this process's TensorFlow repeat itself: every op on the same inputs gives the
    same outputs (`enable_op_determinism`: no thread-order-dependent sums), and random ops
    draw from a generator seeded with `seed`. The networks' initial values and the action
    noise come from numpy generators seeded from `run.seed` already."""
    import tensorflow as tf

    tf.random.set_seed(seed)
    tf.config.experimental.enable_op_determinism()
