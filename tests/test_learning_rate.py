"""One learning-rate section for every algorithm (`easyrl.algorithms.learning_rate`): the same
keys mean the same schedule whatever the algorithm, defaults are what they were, and a config
with a key whose meaning changed fails at load saying what to write instead."""

import dataclasses
import math
import re

import numpy as np
import pytest

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.algorithms.learning_rate import OLD_MEANING, LearningRate
from easyrl.errors import ConfigError

SCHEDULED = sorted(
    n for n in registry.known() if issubclass(registry.params_class(n), LearningRate)
)
"""The algorithms with an optimizer: every one has the `LearningRate` keys."""
GROUP_RATES = {
    "ddpg": ("actor", "critic"),
    "td3": ("actor", "critic"),
    "sac": ("actor", "critic", "alpha"),
}
"""The algorithms whose optimizer groups may start at rates of their own (`<group>_lr`)."""
STEPS = (0, 1, 9, 10, 25, 40, 1000)


def _rates(spec, steps=STEPS) -> list[float]:
    """The learning rate the PS optimizer of `spec` applies after each of `steps` updates."""
    import tensorflow as tf

    from easyrl.algorithms.optimizers import Optimizer

    opt = Optimizer(spec, [tf.Variable(np.zeros(1, np.float32))])
    rates = []
    for step in steps:
        opt.step.assign(step)
        rates.append(float(opt.learning_rate()))
    return rates


def _specs(name: str, **keys) -> list:
    """The PS optimizer specs (one per group) algorithm `name` builds from its `Params` with
    `keys`."""
    spec = registry.module(name).optimizer(registry.params_class(name)(**keys))
    return list(spec.values()) if isinstance(spec, dict) else [spec]


def test_every_algorithm_with_an_optimizer_has_the_schedule():
    assert set(OLD_MEANING) < set(SCHEDULED)
    assert sorted(set(registry.known()) - set(SCHEDULED)) == ["linucb"]  # no optimizer
    for name in registry.known():
        fields = {f.name for f in dataclasses.fields(registry.params_class(name))}
        assert ("lr" in fields) == (name in SCHEDULED), name
        own = {f for f in fields if f.startswith("lr_")} - set(LearningRate.__dataclass_fields__)
        assert not own, f"{name} reads learning-rate keys of its own: {own}"


SCHEDULES = {
    "constant": ({"lr": 0.1}, [0.1] * len(STEPS)),
    "step": (
        {"lr": 0.1, "lr_schedule": "step", "lr_step_period": 10, "lr_step_factor": 0.5},
        [0.1, 0.1, 0.1, 0.05, 0.025, 0.00625, 0.1 * 0.5**100],
    ),
    "linear": (
        {"lr": 0.1, "lr_schedule": "linear", "lr_linear_steps": 40, "lr_end": 0.02},
        [0.1, 0.098, 0.082, 0.08, 0.05, 0.02, 0.02],
    ),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("name", SCHEDULED)
def test_the_same_keys_give_the_same_learning_rates_in_every_algorithm(name, schedule):
    keys, expected = SCHEDULES[schedule]
    for spec in _specs(name, **keys):
        assert _rates(spec) == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("name", sorted(GROUP_RATES))
def test_a_group_of_its_own_rate_follows_the_schedule_in_proportion(name):
    keys, expected = SCHEDULES["linear"]
    own, *rest = GROUP_RATES[name]
    params = registry.params_class(name)(**keys, **{f"{own}_lr": 0.05})
    specs = registry.module(name).optimizer(params)
    assert sorted(specs) == sorted(f"{g}/" for g in GROUP_RATES[name])
    assert _rates(specs[f"{own}/"]) == pytest.approx([r / 2 for r in expected], rel=1e-6)
    for group in rest:  # at lr
        assert _rates(specs[f"{group}/"]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", SCHEDULED)
def test_the_default_schedule_is_constant_at_the_algorithms_lr_as_before(name):
    from easyrl.algorithms.optimizers import OptimizerSpec

    lr = registry.params_class(name)().lr
    # Before: a staircase with rate 1.0 (DQN's family) or no decay (IMPALA's): this spec.
    for spec in _specs(name):
        assert spec == OptimizerSpec(kind="adam", lr=lr)
        assert _rates(spec, (0, 999, 1000, 10**6)) == pytest.approx([lr] * 4)


def test_shipped_configs_keep_their_schedules():
    from easyrl.algorithms.optimizers import OptimizerSpec

    root = config_lib.Path(__file__).resolve().parent.parent / "configs"
    before = {  # the specs the old keys gave (lr_decay_rate 0.9; lr_decay_steps 100000 / 78000)
        "cartpole_apex.yaml": OptimizerSpec(lr=0.002, decay_rate=0.9, decay_steps=1000),
        # constant since issue 40: the step decay froze C51 + noisy heads before they solved
        "cartpole_rainbow.yaml": OptimizerSpec(lr=0.001),
        "pong_impala.yaml": OptimizerSpec(
            lr=6e-4, schedule="polynomial", decay_steps=100_000, end_lr=0.0
        ),
        "pong_impala_2core.yaml": OptimizerSpec(
            lr=6e-4, schedule="polynomial", decay_steps=78_000, end_lr=0.0
        ),
        "pong_apex.yaml": OptimizerSpec(lr=0.00025),
    }
    for name, spec in before.items():
        cfg = config_lib.load(root / name)
        assert registry.module(cfg.algorithm.name).optimizer(cfg.algorithm.params) == spec, name


def _load(name: str, **algorithm):
    raw = {"algorithm": {"name": name, **algorithm}, "env": {"id": "CartPole-v1"}}
    return config_lib.from_dict(raw)


OLD = {
    "step": (
        {"lr_decay_steps": 500, "lr_decay_rate": 0.5},
        "algorithm.lr_decay_steps was the period of a step decay for {name}: write "
        "lr_schedule: step, lr_step_period: 500 and lr_step_factor: 0.5",
        {"decay_rate": 0.5, "decay_steps": 500},
    ),
    "linear": (
        {"lr_decay_steps": 500},
        "algorithm.lr_decay_steps was the horizon of a linear decay to lr_end for {name}: "
        "write lr_schedule: linear and lr_linear_steps: 500",
        {"schedule": "polynomial", "decay_steps": 500, "end_lr": 0.0},
    ),
}


@pytest.mark.parametrize("name", sorted(OLD_MEANING))
def test_an_old_key_fails_at_load_naming_the_keys_that_do_what_it_did(name):
    from easyrl.algorithms.optimizers import OptimizerSpec

    old, message, meant = OLD[OLD_MEANING[name]]
    with pytest.raises(ConfigError) as err:
        _load(name, **old)
    assert str(err.value) == message.format(name=name)
    # What the message says to write builds the schedule the old keys meant.
    written = re.search(r"write (.*)$", str(err.value)).group(1)
    keys = dict(pair.split(": ") for pair in re.split(r", | and ", written))
    params = registry.params_class(name)(
        **{k: type(getattr(LearningRate, k))(v) for k, v in keys.items()}
    )
    lr = params.lr
    assert registry.module(name).optimizer(params) == OptimizerSpec(lr=lr, **meant)


@pytest.mark.parametrize(
    "name, old, message",
    [
        ("dqn", {"lr_decay_rate": 0.9}, "lr_decay_rate was the factor of a step decay for dqn"),
        ("ppo", {"lr_decay_steps": 1000}, "a factor of 1.0 kept the rate constant"),
        ("a3c", {"lr_decay_steps": 0}, "write nothing (0 meant a constant rate"),
    ],
)
def test_an_old_key_that_changed_nothing_still_says_so(name, old, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _load(name, **old)


def test_an_old_key_is_refused_from_an_override_too():
    with pytest.raises(ConfigError, match="write lr_schedule: linear and lr_linear_steps: 7"):
        config_lib.load(
            config_lib.Path(__file__).resolve().parent.parent / "configs" / "cartpole_impala.yaml",
            ["algorithm.lr_decay_steps=7"],
        )


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"lr_step_period": 5}, "lr_step_period must be left at 1000 unless lr_schedule is step"),
        ({"lr_end": 0.1}, "lr_end must be left at 0.0 unless lr_schedule is linear"),
        ({"lr_schedule": "step", "lr_step_factor": 0.0}, "lr_step_factor must be in (0, 1]"),
        ({"lr_schedule": "linear", "lr_end": 1.0}, "lr_end must be in [0, lr]"),
        ({"lr_schedule": "cosine"}, "lr_schedule must be constant or step or linear"),
    ],
)
def test_schedule_keys_are_checked_once_for_every_algorithm(keys, message):
    for name in SCHEDULED:
        with pytest.raises(ConfigError, match=re.escape(message)):
            registry.params_class(name)(**keys)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1e-3])
def test_every_learning_rate_must_be_finite_and_positive(value):
    for name in registry.known():
        cls = registry.params_class(name)
        rates = [
            f.name for f in dataclasses.fields(cls) if f.name == "lr" or f.name.endswith("_lr")
        ]
        for field in rates:
            with pytest.raises(ConfigError, match=f"{field} must be (None or )?finite and > 0"):
                cls(**{field: value})
