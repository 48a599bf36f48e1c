"""The optimizer and learning-rate keys every algorithm shares: one set of keys, each with one
meaning whatever the algorithm (its `Params` derives from `LearningRate`).

With t the PS updates the optimizer has applied:
    lr_schedule: constant   lr_t = lr
    lr_schedule: step       lr_t = lr * lr_step_factor ** floor(t / lr_step_period)
    lr_schedule: linear     lr_t = lr_end + (lr - lr_end) * (1 - min(t / lr_linear_steps, 1))

An algorithm with several optimizer groups (TD3/DDPG: actor and critic; SAC: actor, critic and
temperature) may give a group its own initial rate (`actor_lr`, ...; None: `lr`); the schedule
moves every group alike, each group's rate staying in the same proportion to `lr`
(`group_rate`; under a linear schedule the group's end rate is `lr_end * group_lr / lr`).

Before these keys, `lr_decay_steps` was the period of a step decay in some algorithms and the
horizon of a linear decay in others; `refuse_old_keys` turns a config that still has it (or
`lr_decay_rate`) away with the keys to write instead. Nothing here imports TensorFlow.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from easyrl.errors import ConfigError

Schedule = Literal["constant", "step", "linear"]
SCHEDULES: tuple[Schedule, ...] = ("constant", "step", "linear")
OPTIMIZERS = ("adam", "rmsprop", "sgd")


@dataclass(frozen=True)
class LearningRate:
    """The PS optimizer and its learning-rate schedule (the keys above). A key of a schedule
    other than `lr_schedule` must stay at its default: it would be ignored."""

    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    """Optimizer the PS shards apply gradients with."""
    lr: float = 1e-3
    """Learning rate (the initial one under a step or linear schedule)."""
    lr_schedule: Schedule = "constant"
    """constant: lr throughout; step: lr times lr_step_factor every lr_step_period updates;
    linear: lr falls to lr_end over lr_linear_steps updates, then stays there."""
    lr_step_period: int = 1000
    """lr_schedule step: PS updates between two multiplications by lr_step_factor."""
    lr_step_factor: float = 0.5
    """lr_schedule step: what the learning rate is multiplied by every lr_step_period updates."""
    lr_linear_steps: int = 100_000
    """lr_schedule linear: PS updates over which the learning rate falls from lr to lr_end."""
    lr_end: float = 0.0
    """lr_schedule linear: the learning rate after lr_linear_steps updates."""


def positive_rate(value: float) -> bool:
    """Whether a learning rate is finite and > 0 (NaN and inf are not)."""
    return math.isfinite(value) and value > 0.0


_UNUSED_UNLESS = {
    "lr_step_period": "step",
    "lr_step_factor": "step",
    "lr_linear_steps": "linear",
    "lr_end": "linear",
}
_DEFAULTS = LearningRate()


def lr_checks(p: LearningRate) -> dict[str, tuple[bool, str]]:
    """Range checks of the `LearningRate` keys, for `easyrl.errors.check_ranges`; written so
    that NaN fails every check."""
    checks = {
        "optimizer": (p.optimizer in OPTIMIZERS, " or ".join(OPTIMIZERS)),
        "lr": (positive_rate(p.lr), "finite and > 0"),
        "lr_schedule": (p.lr_schedule in SCHEDULES, " or ".join(SCHEDULES)),
        "lr_step_period": (p.lr_step_period >= 1, ">= 1"),
        "lr_step_factor": (0.0 < p.lr_step_factor <= 1.0, "in (0, 1]"),
        "lr_linear_steps": (p.lr_linear_steps >= 1, ">= 1"),
        "lr_end": (0.0 <= p.lr_end <= p.lr, "in [0, lr]"),
    }
    for key, schedule in _UNUSED_UNLESS.items():
        default = getattr(_DEFAULTS, key)
        if p.lr_schedule != schedule and getattr(p, key) != default:
            checks[key] = (False, f"left at {default!r} unless lr_schedule is {schedule}")
    return checks


def group_rate(p: LearningRate, rate: float | None) -> float:
    """The initial rate of an optimizer group: its own key's value, or `lr` when it is None."""
    return p.lr if rate is None else rate


def group_rate_checks(p: LearningRate, keys: tuple[str, ...]) -> dict[str, tuple[bool, str]]:
    """`lr_checks` and the range checks of the per-group rate keys `keys` (each None or a
    positive rate), for `easyrl.errors.check_ranges`."""
    checks = lr_checks(p)
    for key in keys:
        value = getattr(p, key)
        checks[key] = (value is None or positive_rate(value), "None or finite and > 0")
    return checks


def schedule_keys(p: LearningRate) -> dict[str, Any]:
    """{key: value} of the `LearningRate` keys of `p` (to build another `Params` with the same
    optimizer and schedule)."""
    return {key: getattr(p, key) for key in LearningRate.__dataclass_fields__}


OLD_MEANING: dict[str, Literal["step", "linear"]] = {
    **dict.fromkeys(("a2c", "bc", "bcq", "dqn", "es", "marwil", "pg", "ppo", "r2d2"), "step"),
    **dict.fromkeys(("a3c", "impala"), "linear"),
}
"""What `lr_decay_steps` meant for each algorithm before `lr_schedule`: the period of a step
decay (with `lr_decay_rate`, default 1.0: no decay), or the horizon of a linear decay to
`lr_end` (0: none)."""


def refuse_old_keys(algorithm: str, raw: Mapping[str, Any], prefix: str = "algorithm") -> None:
    """Refuses the keys whose meaning changed (`lr_decay_steps`, `lr_decay_rate`) in the raw
    `algorithm` section of `algorithm`, saying exactly what to write instead.

    Raises:
        ConfigError: `raw` holds an old key; the message gives the equivalent new keys.
    """
    meaning = OLD_MEANING.get(algorithm)
    old = [key for key in ("lr_decay_steps", "lr_decay_rate") if key in raw]
    if meaning is None or not old:
        return
    if meaning == "linear":
        steps = raw.get("lr_decay_steps", 0)
        was = f"the horizon of a linear decay to lr_end for {algorithm}"
        write = (
            f"lr_schedule: linear and lr_linear_steps: {steps}"
            if steps
            else "nothing (0 meant a constant rate: lr_schedule: constant, the default)"
        )
    else:
        period, factor = raw.get("lr_decay_steps", 1000), raw.get("lr_decay_rate", 1.0)
        was = f"the {'period' if old[0] == 'lr_decay_steps' else 'factor'} of a step decay for "
        was += algorithm
        write = f"lr_schedule: step, lr_step_period: {period} and lr_step_factor: {factor}"
        if factor == 1.0:
            write += " (or nothing: a factor of 1.0 kept the rate constant, the default)"
    raise ConfigError(f"{prefix}.{old[0]} was {was}: write {write}")
