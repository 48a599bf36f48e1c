"""One way to derive the seeds of a run's random streams from `run.seed`."""

import numpy as np

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
