"""Behaviour cloning: MARWIL with beta = 0, i.e. maximum likelihood of the logged actions,

    loss = -mean(log pi(a | s))

on a recorded dataset (`input.dir`). Everything (agent, replay columns, dataset items,
optimizer) is `easyrl.algorithms.marwil`'s; only `Params` differs: beta is fixed at 0 and
no value head is built.
"""

import dataclasses
from dataclasses import dataclass

from easyrl.algorithms import marwil
from easyrl.errors import ConfigError


@dataclass(frozen=True)
class Params(marwil.Params):
    """Hyper-parameters of BC: MARWIL's (see `marwil.Params`) with beta fixed at 0
    (vf_coeff, gamma and the advantage-norm fields have no effect)."""

    beta: float = 0.0
    """Fixed at 0 (for beta > 0 use algorithm.name: marwil)."""

    def __post_init__(self):
        if self.beta != 0.0:
            raise ConfigError(f"bc: beta is fixed at 0 (use marwil for beta > 0), got {self.beta}")
        marwil.check_params("bc", self)


optimizer = marwil.optimizer
replay_spec = marwil.replay_spec
dataset_items = marwil.dataset_items
build = marwil.build

SPEC = dataclasses.replace(marwil.SPEC, params_class=Params)
"""BC, as the runtime knows it: MARWIL's spec with BC's `Params`."""
