"""Optimizers the PS shards apply pushed gradients with (plain TF, checkpointable as numpy).

Written directly in TF rather than through Keras so that the slots are ordinary
named variables a shard can save to and restore from its `.npz` checkpoint.
"""

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import tensorflow as tf

from easyrl.algorithms.learning_rate import LearningRate, group_rate
from easyrl.models.flat import Compiled, FlatGradients, FlatLayout, FlatVariables, in_place


@dataclass(frozen=True)
class OptimizerSpec:
    """What a PS shard needs to know to build its optimizer."""

    kind: Literal["adam", "rmsprop", "sgd"] = "adam"
    lr: float = 1e-3
    decay_rate: float = 1.0
    """schedule "exponential": lr is multiplied by decay_rate every decay_steps applied
    updates (staircase)."""
    decay_steps: int = 1000
    schedule: Literal["exponential", "polynomial"] = "exponential"
    """"polynomial": lr falls from lr to end_lr over decay_steps updates as
    (lr - end_lr) * (1 - t / decay_steps) ** power + end_lr, then stays at end_lr."""
    end_lr: float = 0.0
    power: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self):
        if self.kind not in ("adam", "rmsprop", "sgd"):
            raise ValueError(f"unknown optimizer {self.kind!r}; known: adam, rmsprop, sgd")
        if self.schedule not in ("exponential", "polynomial"):
            raise ValueError(f"unknown schedule {self.schedule!r}; known: exponential, polynomial")
        # Written so that NaN fails every check.
        valid = (
            self.lr > 0
            and self.decay_steps >= 1
            and 0 < self.decay_rate <= 1
            and 0 <= self.beta1 < 1
            and 0 <= self.beta2 < 1
            and self.epsilon > 0
            and 0 <= self.end_lr <= self.lr
            and self.power > 0
        )
        if not valid:
            raise ValueError(f"invalid optimizer settings {self}")


def schedule_spec(params: LearningRate, rate: float | None = None) -> OptimizerSpec:
    """The spec of an algorithm's `LearningRate` keys (`optimizer`, `lr`, `lr_schedule`: see
    `easyrl.algorithms.learning_rate`): constant, a step decay as the exponential staircase,
    a linear decay as the polynomial of power 1. `rate`: an optimizer group's own initial
    rate (`group_rate`), which the schedule moves in proportion to `lr`."""
    lr = group_rate(params, rate)
    if params.lr_schedule == "step":
        return OptimizerSpec(
            kind=params.optimizer,
            lr=lr,
            decay_rate=params.lr_step_factor,
            decay_steps=params.lr_step_period,
        )
    if params.lr_schedule == "linear":
        return OptimizerSpec(
            kind=params.optimizer,
            lr=lr,
            schedule="polynomial",
            decay_steps=params.lr_linear_steps,
            end_lr=min(lr, params.lr_end * lr / params.lr),
        )
    return OptimizerSpec(kind=params.optimizer, lr=lr)


SLOTS = {"adam": 2, "rmsprop": 1, "sgd": 0}
"""Optimizer slots per variable, by kind (each the variable's size)."""


class Optimizer(tf.Module):
    """Adam, RMSProp or SGD over a fixed list of variables.

    Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
          x -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps).
    RMSProp: v = b2 v + (1-b2) g^2; x -= lr * g / (sqrt(v) + eps).
    SGD: x -= lr * g.
    """

    def __init__(self, spec: OptimizerSpec, variables: Sequence[tf.Variable]):
        super().__init__(name=None)
        self.spec = spec
        self.variables_ = list(variables)
        # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # pyright: ignore[reportArgumentType]
        num_slots = SLOTS[spec.kind]
        self.slots = [
            [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables_]
            for _ in range(num_slots)
        ]

    def learning_rate(self) -> tf.Tensor:
        """The current (decayed) learning rate."""
        s = self.spec
        if s.schedule == "polynomial":
            done = tf.minimum(tf.cast(self.step, tf.float32) / s.decay_steps, 1.0)
            return (s.lr - s.end_lr) * tf.pow(1.0 - done, s.power) + s.end_lr
        exponent = tf.cast(self.step // s.decay_steps, tf.float32)
        return s.lr * tf.pow(s.decay_rate, exponent)

    @tf.function(autograph=False)  # plain Python loops over variables, unrolled
    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        """Applies one update with `grads`, given in the order of the variables."""
        lr = self.learning_rate()
        self.step.assign_add(1)
        s = self.spec
        if s.kind == "adam":
            # Fused kernel: one op per variable instead of eight (same equations as above).
            t = tf.cast(self.step, tf.float32)
            for x, g, m, v in zip(self.variables_, grads, *self.slots, strict=True):
                tf.raw_ops.ResourceApplyAdam(
                    var=x.handle,
                    m=m.handle,
                    v=v.handle,
                    # float ** Tensor runs Tensor.__rpow__, which TF's stub lacks.
                    beta1_power=s.beta1**t,  # pyright: ignore[reportOperatorIssue]
                    beta2_power=s.beta2**t,  # pyright: ignore[reportOperatorIssue]
                    lr=lr,
                    beta1=s.beta1,
                    beta2=s.beta2,
                    epsilon=s.epsilon,
                    grad=g,
                )
        elif s.kind == "rmsprop":
            for x, g, v in zip(self.variables_, grads, *self.slots, strict=True):
                v.assign(s.beta2 * v + (1 - s.beta2) * tf.square(g))
                x.assign_sub(lr * g / (tf.sqrt(v) + s.epsilon))
        else:
            for x, g in zip(self.variables_, grads, strict=True):
                tf.raw_ops.ResourceApplyGradientDescent(var=x.handle, alpha=lr, delta=g)


class OptimizerGroups:
    """The variables of one PS shard and their optimizers: one per variable group, each
    group the variables whose names start with its prefix (e.g. "actor/", "critic/",
    "alpha/"), each applied with its own optimizer, learning rate and step counter. A single
    spec is one group of every variable (prefix "").

    A group's variables live in one flat TF variable (and each optimizer slot in one flat
    slot): a step is one fused kernel call per group however many variables it holds (Adam
    on the 2.1 MB and 21 MB test networks: 2.2 -> 1.2 ms and 15 -> 7.6 ms per step on 2
    cores). `values`, `state` and `load_state` speak per variable, as checkpoints do.

    A push may carry gradients for some groups only (TD3 updates its actor every other
    step): only those groups' optimizers step, so Adam never moves a variable it got no
    gradient for.

    Args:
        specs: one spec, or {prefix: spec}.
        values: {name: initial float32 value} of the shard's variables, in the order their
            gradients and values are given.

    Raises:
        ValueError: a variable matches no prefix or more than one.
    """

    def __init__(self, specs, values: dict[str, np.ndarray]):
        specs = as_groups(specs)
        self.names = list(values)
        self.members = group_members(specs, self.names)
        """{prefix: variable names} of the groups this shard holds variables of."""
        self.group_of = {name: p for p, names in self.members.items() for name in names}
        self.layouts: dict[str, FlatLayout] = {}
        self.variables: dict[str, tf.Variable] = {}
        """{prefix: the group's variables as one flat variable}."""
        self.optimizers: dict[str, Optimizer] = {}
        self._steps: dict[str, Compiled] = {}
        for p, names in self.members.items():
            layout = self.layouts[p] = FlatLayout([np.shape(values[n]) for n in names])
            flat = layout.concat([np.asarray(values[n], np.float32) for n in names])
            # TF's stub types `initial_value` as a Tensor; tf.Variable takes any array.
            self.variables[p] = tf.Variable(flat, name=f"group{len(self.variables)}")  # pyright: ignore[reportArgumentType]
            optimizer = self.optimizers[p] = Optimizer(specs[p], [self.variables[p]])
            spec = tf.TensorSpec([layout.size], tf.float32)
            self._steps[p] = Compiled(lambda g, opt=optimizer: opt.apply([g]), spec)

    def groups_in(self, names) -> list[str]:
        """The groups `names` covers; each must be covered completely.

        Raises:
            ValueError: `names` holds part of a group only.
        """
        return groups_in(self.members, self.group_of, names)

    def flatten(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{prefix: flat gradient} of the groups `grads` ({name: gradient}) covers (views,
        no copy, when a group's gradients lie back to back in one message).

        Raises:
            ValueError: `grads` holds part of a group only.
        """
        return {
            p: self.layouts[p].concat([grads[n] for n in self.members[p]])
            for p in self.groups_in(grads)
        }

    def apply_flat(self, flat_grads: dict[str, np.ndarray]) -> None:
        """One step of each group in `flat_grads` (what `flatten` returned; read in place
        where TensorFlow can, see `in_place`)."""
        for p, flat in flat_grads.items():
            self._steps[p](in_place(flat))

    def apply(self, grads: dict[str, np.ndarray]) -> None:
        """One step of each group `grads` ({name: gradient}) covers completely."""
        self.apply_flat(self.flatten(grads))

    def values(self) -> dict[str, np.ndarray]:
        """{name: current value} of every variable, in the order they were given (views of
        one copy per group)."""
        parts = {}
        for p, names in self.members.items():
            parts.update(zip(names, self.layouts[p].split(self.variables[p].numpy())))
        return {n: parts[n] for n in self.names}

    def assign(self, values: dict[str, np.ndarray]) -> None:
        """Sets every variable to `values` ({name: value}, all of them)."""
        for p, names in self.members.items():
            self.variables[p].assign(self.layouts[p].concat([values[n] for n in names]))

    def state(self) -> dict[str, np.ndarray]:
        """Every group's step and slots, keys prefixed by the group's prefix: `step`, and
        `slot<k>/<i>` shaped like the group's i-th variable."""
        state = {}
        for p, opt in self.optimizers.items():
            state[f"{p}step"] = opt.step.numpy()
            for k, (slot,) in enumerate(opt.slots):
                parts = self.layouts[p].split(slot.numpy())
                state.update({f"{p}slot{k}/{i}": part for i, part in enumerate(parts)})
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restores what `state` returned (checked whole before anything changes).

        Raises:
            ValueError: `state` lacks a key, or a slot's shape is not its variable's.
        """
        steps, slots = {}, {}
        for p, opt in self.optimizers.items():
            steps[p] = int(np.asarray(state_entry(state, f"{p}step")))
            for k in range(len(opt.slots)):
                parts = [
                    slot_entry(state, f"{p}slot{k}/{i}", shape)
                    for i, shape in enumerate(self.layouts[p].shapes)
                ]
                slots[p, k] = self.layouts[p].concat(parts)
        for p, opt in self.optimizers.items():
            opt.step.assign(steps[p])
            for k, (slot,) in enumerate(opt.slots):
                slot.assign(slots[p, k])


def state_entry(state: dict[str, np.ndarray], key: str) -> np.ndarray:
    """`state[key]`, or ValueError naming the missing key."""
    if key not in state:
        raise ValueError(f"optimizer state lacks {key!r}")
    return state[key]


def slot_entry(state: dict[str, np.ndarray], key: str, shape) -> np.ndarray:
    """`state[key]` as float32, or ValueError naming the missing key or the wrong shape."""
    part = state_entry(state, key)
    if tuple(np.shape(part)) != tuple(shape):
        raise ValueError(f"optimizer state {key}: shape {np.shape(part)}, expected {tuple(shape)}")
    return np.asarray(part, np.float32)


def as_groups(specs) -> dict[str, OptimizerSpec]:
    """{prefix: spec} of one spec (the group "" of every variable) or of {prefix: spec}."""
    return {"": specs} if isinstance(specs, OptimizerSpec) else dict(specs)


def group_members(specs: dict[str, OptimizerSpec], names) -> dict[str, list[str]]:
    """{prefix: the variable names, in the order given, that start with it} of the groups
    that hold any of `names`.

    Raises:
        ValueError: a name matches no prefix or more than one.
    """
    members: dict[str, list[str]] = {prefix: [] for prefix in specs}
    for name in names:
        matches = [p for p in specs if name.startswith(p)]
        if len(matches) != 1:
            raise ValueError(
                f"variable {name!r} matches optimizer groups {matches}; every variable "
                f"needs exactly one of {sorted(specs)}"
            )
        members[matches[0]].append(name)
    return {p: group for p, group in members.items() if group}


def groups_in(members: dict[str, list[str]], group_of: dict[str, str], names) -> list[str]:
    """The groups of `members` that `names` covers; each must be covered completely.

    Raises:
        ValueError: `names` holds part of a group only.
    """
    present = sorted({group_of[n] for n in names})
    for p in present:
        missing = sorted(set(members[p]) - set(names))
        if missing:
            raise ValueError(f"gradients for group {p!r} lack {missing}")
    return present


class LocalOptimizer:
    """A learner's own optimizer (a run with one learner applies its updates itself and
    publishes the values to the PS shards, `easyrl.roles.publisher`): the algorithm's
    optimizer groups, as a PS shard has them, applied in place to the learner's variables.

    Its state speaks the PS shards' checkpoint format (`OptimizerGroups.state`) for the
    variables of any one shard, so a shard checkpoints what the learner publishes and a
    restarted learner starts from what the shard restored.

    Args:
        specs: one spec, or {prefix: spec} (what the PS shards get).
        variables: {name: tf.Variable} of the learner's network.

    Raises:
        ValueError: a variable matches no optimizer group or more than one.
    """

    def __init__(self, specs, variables: dict[str, tf.Variable]):
        specs = as_groups(specs)
        self.names = list(variables)
        self.members = group_members(specs, self.names)
        self.group_of = {name: p for p, names in self.members.items() for name in names}
        self.optimizers = {
            p: Optimizer(specs[p], [variables[n] for n in names])
            for p, names in self.members.items()
        }
        self.layout = FlatVariables(list(variables.values()))
        """The flat gradient `apply` takes: every variable's, in the order of `names`."""
        self._steps: dict[frozenset[int], Compiled] = {}  # by the absent variables
        self._index = {n: names.index(n) for names in self.members.values() for n in names}
        self._position = {n: i for i, n in enumerate(self.names)}

    def apply(self, grads: Sequence[np.ndarray | None]) -> bool:
        """One update: `grads` in the order of `names` (None: a variable this update leaves
        alone; a `FlatGradients` hands its tensor over without leaving TensorFlow) steps each
        group it covers, in one compiled call, unless one of their gradients is not finite
        (checked in that call). Returns whether it stepped (gradients whose agent step
        applied them already, `GradientStep.fuse`, are not applied again).

        Raises:
            ValueError: `grads` covers part of a group only, or is laid out otherwise.
        """
        if isinstance(grads, FlatGradients):
            if grads.layout.shapes != self.layout.shapes:
                raise ValueError("gradients laid out unlike the variables")
            if grads.applied is not None:
                return bool(grads.applied)
            flat, absent = grads.tensor, grads.absent
        else:
            if len(grads) != len(self.names):
                raise ValueError(f"{len(grads)} gradients for {len(self.names)} variables")
            absent = frozenset(i for i, g in enumerate(grads) if g is None)
            parts = [
                np.zeros(size, np.float32) if g is None else np.ravel(g)
                for g, size in zip(grads, self.layout.sizes, strict=True)
            ]
            flat = self.layout.concat(parts)
        step = self._steps.get(absent)
        if step is None:
            spec = tf.TensorSpec([self.layout.size], tf.float32)
            step = self._steps[absent] = Compiled(self.traced(absent), spec)
        return bool(step(flat))

    def traced(self, absent: Collection[int] = ()) -> Callable[[tf.Tensor], tf.Tensor]:
        """The update as a function to trace into a compiled call (what `apply` compiles,
        and what an agent's `GradientStep.fuse` takes): flat gradient -> whether it stepped
        the groups of the variables not `absent` (indices into `names`).

        Raises:
            ValueError: the variables not `absent` cover part of a group only.
        """
        absent = frozenset(absent)
        present = [n for i, n in enumerate(self.names) if i not in absent]
        groups = groups_in(self.members, self.group_of, present)
        return lambda flat: self._step(flat, groups)

    def _step(self, flat: tf.Tensor, groups: list[str]) -> tf.Tensor:
        parts = self.layout.split_tensor(flat)
        grads = {p: [parts[self._position[n]] for n in self.members[p]] for p in groups}
        if len(groups) == len(self.members):  # every variable: one check of the whole
            finite = tf.reduce_all(tf.math.is_finite(flat))
        else:
            checks = [tf.reduce_all(tf.math.is_finite(g)) for p in groups for g in grads[p]]
            finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)

        def step() -> tf.Tensor:
            for p in groups:
                self.optimizers[p].apply(grads[p])
            return tf.constant(True)

        return tf.cond(finite, step, lambda: tf.constant(False))

    def _shard_groups(self, names) -> dict[str, list[str]]:
        """{prefix: the names of `names` in that group, in the order given}."""
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(self.group_of[n], []).append(n)
        return groups

    def state(self, names) -> dict[str, np.ndarray]:
        """The state of the shard holding the variables `names` (in the shard's order), in
        `OptimizerGroups.state`'s format."""
        state = {}
        for p, group in self._shard_groups(names).items():
            opt = self.optimizers[p]
            state[f"{p}step"] = opt.step.numpy()
            for k, slot in enumerate(opt.slots):
                for i, n in enumerate(group):
                    state[f"{p}slot{k}/{i}"] = slot[self._index[n]].numpy()
        return state

    def load_state(self, names, state: dict[str, np.ndarray]) -> None:
        """Loads what a shard holding the variables `names` sent (`state`'s format), checked
        whole before anything changes. A group several shards hold takes the step of the
        last shard loaded (they agree: one learner published them all).

        Raises:
            ValueError: `state` lacks a key, or a slot's shape is not its variable's.
        """
        loads = []  # (variable, value)
        for p, group in self._shard_groups(names).items():
            opt = self.optimizers[p]
            loads.append((opt.step, int(np.asarray(state_entry(state, f"{p}step")))))
            for k, slot in enumerate(opt.slots):
                for i, n in enumerate(group):
                    target = slot[self._index[n]]
                    loads.append((target, slot_entry(state, f"{p}slot{k}/{i}", target.shape)))
        for variable, value in loads:
            variable.assign(value)
