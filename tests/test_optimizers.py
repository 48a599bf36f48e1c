"""Tests of easyrl.algorithms.optimizers against numpy implementations of its formulas."""

import numpy as np
import pytest
import tensorflow as tf

from easyrl.algorithms.optimizers import LocalOptimizer, Optimizer, OptimizerGroups, OptimizerSpec
from easyrl.aligned import aligned_empty
from easyrl.models.flat import FlatGradients, FlatVariables, as_tensor, in_place

# Two variables of different shapes, so per-variable slots and the zip over them are exercised.
X0 = [
    np.array([[0.5, -1.0, 2.0], [0.25, 0.0, -3.0]]),
    np.array([1.5, -0.75]),
]
# One gradient list per step; signs and magnitudes vary so Adam's m/v matter.
GRADS = [
    [np.array([[0.1, -0.2, 0.3], [1.0, -2.0, 0.5]]), np.array([0.4, -0.05])],
    [np.array([[-0.3, 0.1, 0.2], [0.5, 1.0, -0.25]]), np.array([-0.2, 0.6])],
    [np.array([[0.05, 0.4, -0.1], [-1.5, 0.3, 0.75]]), np.array([0.1, 0.1])],
    [np.array([[0.2, 0.2, 0.2], [0.0, -0.5, 1.0]]), np.array([-0.9, 0.3])],
    [np.array([[-0.1, 0.3, 0.6], [0.8, 0.1, -0.4]]), np.array([0.25, -0.5])],
    [np.array([[0.7, -0.6, 0.5], [-0.4, 0.3, -0.2]]), np.array([0.05, 0.8])],
]


def make(spec: OptimizerSpec, values=X0) -> tuple[Optimizer, list[tf.Variable]]:
    variables = [tf.Variable(v.astype(np.float32)) for v in values]
    return Optimizer(spec, variables), variables


def apply(opt: Optimizer, grads) -> None:
    opt.apply([tf.constant(g, tf.float32) for g in grads])


def values(variables) -> list[np.ndarray]:
    return [v.numpy().astype(np.float64) for v in variables]


def assert_close(actual, expected, atol=1e-6) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol)


# --- numpy references (float64), straight from the Optimizer docstring --------------------


def ref_lr(spec: OptimizerSpec, applied: int) -> float:
    """Learning rate used by the update that follows `applied` earlier updates."""
    return spec.lr * spec.decay_rate ** (applied // spec.decay_steps)


def ref_sgd(spec, x0, grads_seq):
    x = [v.copy() for v in x0]
    for t, grads in enumerate(grads_seq):
        lr = ref_lr(spec, t)
        x = [xi - lr * g for xi, g in zip(x, grads, strict=True)]
    return x


def ref_adam(spec, x0, grads_seq):
    x = [v.copy() for v in x0]
    m = [np.zeros_like(v) for v in x0]
    v = [np.zeros_like(v) for v in x0]
    history = []
    for step, grads in enumerate(grads_seq):
        lr = ref_lr(spec, step)
        t = step + 1
        scale = lr * np.sqrt(1 - spec.beta2**t) / (1 - spec.beta1**t)
        for i, g in enumerate(grads):
            m[i] = spec.beta1 * m[i] + (1 - spec.beta1) * g
            v[i] = spec.beta2 * v[i] + (1 - spec.beta2) * g**2
            x[i] = x[i] - scale * m[i] / (np.sqrt(v[i]) + spec.epsilon)
        history.append(([a.copy() for a in x], [a.copy() for a in m], [a.copy() for a in v]))
    return history


def ref_rmsprop(spec, x0, grads_seq):
    x = [v.copy() for v in x0]
    v = [np.zeros_like(v) for v in x0]
    history = []
    for step, grads in enumerate(grads_seq):
        lr = ref_lr(spec, step)
        for i, g in enumerate(grads):
            v[i] = spec.beta2 * v[i] + (1 - spec.beta2) * g**2
            x[i] = x[i] - lr * g / (np.sqrt(v[i]) + spec.epsilon)
        history.append(([a.copy() for a in x], [a.copy() for a in v]))
    return history


# --- SGD ----------------------------------------------------------------------------------


def test_sgd_steps_by_hand():
    spec = OptimizerSpec(kind="sgd", lr=0.1)
    opt, variables = make(spec)
    assert opt.slots == []
    apply(opt, GRADS[0])
    # x - 0.1 g, written out for the first entries.
    assert variables[0].numpy()[0].tolist() == pytest.approx([0.49, -0.98, 1.97], abs=1e-6)
    assert variables[1].numpy().tolist() == pytest.approx([1.46, -0.745], abs=1e-6)
    apply(opt, GRADS[1])
    assert_close(values(variables), ref_sgd(spec, X0, GRADS[:2]))
    assert int(opt.step.numpy()) == 2


def test_sgd_zero_gradient_changes_nothing():
    opt, variables = make(OptimizerSpec(kind="sgd", lr=0.5))
    apply(opt, [np.zeros_like(v) for v in X0])
    assert_close(values(variables), X0, atol=0)


# --- Adam ---------------------------------------------------------------------------------


def test_adam_first_three_steps_match_numpy():
    spec = OptimizerSpec(kind="adam", lr=0.05, beta1=0.8, beta2=0.95, epsilon=1e-3)
    opt, variables = make(spec)
    history = ref_adam(spec, X0, GRADS[:3])
    for t in range(3):
        apply(opt, GRADS[t])
        x, m, v = history[t]
        assert_close(values(variables), x)
        assert_close([s.numpy() for s in opt.slots[0]], m)
        assert_close([s.numpy() for s in opt.slots[1]], v, atol=1e-8)
        assert int(opt.step.numpy()) == t + 1


def test_adam_first_step_by_hand():
    # Step 1: m = (1-b1) g, v = (1-b2) g^2, scale = lr sqrt(1-b2)/(1-b1), so the update is
    # lr * g / (|g| + eps / sqrt(1-b2)): about lr * sign(g) when eps is tiny.
    spec = OptimizerSpec(kind="adam", lr=0.01)
    opt, variables = make(spec)
    apply(opt, GRADS[0])
    expected = [x - 0.01 * np.sign(g) * (g != 0) for x, g in zip(X0, GRADS[0], strict=True)]
    assert_close(values(variables), expected, atol=1e-6)


def test_adam_default_spec_six_steps():
    spec = OptimizerSpec()
    assert spec.kind == "adam"
    opt, variables = make(spec)
    for grads in GRADS:
        apply(opt, grads)
    assert_close(values(variables), ref_adam(spec, X0, GRADS)[-1][0])


# --- RMSProp ------------------------------------------------------------------------------


def test_rmsprop_matches_numpy():
    spec = OptimizerSpec(kind="rmsprop", lr=0.02, beta2=0.9, epsilon=1e-4)
    opt, variables = make(spec)
    assert len(opt.slots) == 1
    history = ref_rmsprop(spec, X0, GRADS[:4])
    for t in range(4):
        apply(opt, GRADS[t])
        x, v = history[t]
        assert_close(values(variables), x)
        assert_close([s.numpy() for s in opt.slots[0]], v, atol=1e-8)


def test_rmsprop_first_step_by_hand():
    # v = (1-b2) g^2 = 0.1 g^2, so the update is lr * g / (sqrt(0.1) |g| + eps).
    spec = OptimizerSpec(kind="rmsprop", lr=0.1, beta2=0.9, epsilon=1e-12)
    opt, variables = make(spec)
    apply(opt, GRADS[0])
    expected = [
        x - 0.1 * np.sign(g) / np.sqrt(0.1) * (g != 0) for x, g in zip(X0, GRADS[0], strict=True)
    ]
    assert_close(values(variables), expected, atol=1e-5)


# --- learning-rate decay ------------------------------------------------------------------


def test_staircase_decay_halves_every_two_steps():
    spec = OptimizerSpec(kind="sgd", lr=0.4, decay_rate=0.5, decay_steps=2)
    opt, variables = make(spec)
    expected_lrs = [0.4, 0.4, 0.2, 0.2, 0.1, 0.1]
    for step, grads in enumerate(GRADS):
        assert float(opt.learning_rate()) == pytest.approx(expected_lrs[step], rel=1e-6)
        before = values(variables)
        apply(opt, grads)
        after = values(variables)
        # The update that follows `step` applied ones used expected_lrs[step].
        for b, a, g in zip(before, after, grads, strict=True):
            np.testing.assert_allclose(b - a, expected_lrs[step] * g, rtol=1e-5, atol=1e-6)
    assert float(opt.learning_rate()) == pytest.approx(0.05, rel=1e-6)
    assert_close(values(variables), ref_sgd(spec, X0, GRADS))


def test_polynomial_decay_falls_linearly_to_end_lr_then_stays():
    # EasyRL's IMPALA schedule: lr -> end_lr over decay_steps updates (power 1: linear).
    spec = OptimizerSpec(kind="sgd", lr=0.4, schedule="polynomial", decay_steps=4, end_lr=0.1)
    opt, variables = make(spec)
    expected_lrs = [0.4, 0.325, 0.25, 0.175, 0.1, 0.1]  # 0.3 * (1 - t / 4) + 0.1
    for step, grads in enumerate(GRADS):
        assert float(opt.learning_rate()) == pytest.approx(expected_lrs[step], rel=1e-6)
        before = values(variables)
        apply(opt, grads)
        for b, a, g in zip(before, values(variables), grads, strict=True):
            np.testing.assert_allclose(b - a, expected_lrs[step] * g, rtol=1e-5, atol=1e-6)
    squared = OptimizerSpec(kind="sgd", lr=1.0, schedule="polynomial", decay_steps=4, power=2.0)
    opt, _ = make(squared)
    apply(opt, GRADS[0])
    assert float(opt.learning_rate()) == pytest.approx(0.75**2, rel=1e-6)


def test_decay_applies_to_adam_too():
    spec = OptimizerSpec(kind="adam", lr=0.05, decay_rate=0.5, decay_steps=2)
    opt, variables = make(spec)
    for grads in GRADS[:5]:
        apply(opt, grads)
    assert_close(values(variables), ref_adam(spec, X0, GRADS[:5])[-1][0])
    # Without decay the result differs: the test can tell.
    undecayed = ref_adam(OptimizerSpec(kind="adam", lr=0.05), X0, GRADS[:5])[-1][0]
    assert not np.allclose(values(variables)[0], undecayed[0], atol=1e-4)


def test_no_decay_by_default():
    opt, _ = make(OptimizerSpec(kind="sgd", lr=0.3))
    for _ in range(5):
        apply(opt, GRADS[0])
    assert float(opt.learning_rate()) == pytest.approx(0.3, rel=1e-6)


# --- state / load_state -------------------------------------------------------------------


def make_groups(spec: OptimizerSpec, values=X0) -> OptimizerGroups:
    """A PS shard's optimizer over X0's two variables (one group), as `v0`, `v1`."""
    return OptimizerGroups(spec, {f"v{i}": np.asarray(v, np.float32) for i, v in enumerate(values)})


def apply_groups(groups: OptimizerGroups, grads) -> None:
    groups.apply({f"v{i}": np.asarray(g, np.float32) for i, g in enumerate(grads)})


@pytest.mark.parametrize("kind", ["adam", "rmsprop", "sgd"])
def test_state_round_trip_continues_identically(kind):
    spec = OptimizerSpec(kind=kind, lr=0.05, decay_rate=0.5, decay_steps=2)
    original = make_groups(spec)
    for grads in GRADS[:3]:
        apply_groups(original, grads)
    state = original.state()
    assert isinstance(state["step"], np.ndarray | np.integer) and int(state["step"]) == 3
    num_slots = {"adam": 2, "rmsprop": 1, "sgd": 0}[kind]
    expected_keys = {"step"} | {f"slot{k}/{i}" for k in range(num_slots) for i in range(2)}
    assert set(state) == expected_keys
    for key, value in state.items():
        assert isinstance(value, np.ndarray | np.integer), key
        if key != "step":  # a slot is shaped like its variable, as in every checkpoint
            assert value.shape == X0[int(key[-1])].shape, key

    # A fresh optimizer over the same values, restored from `state`.
    restored = make_groups(spec, list(original.values().values()))
    restored.load_state({k: np.copy(v) for k, v in state.items()})
    assert float(restored.optimizers[""].learning_rate()) == pytest.approx(0.025, rel=1e-6)
    for grads in GRADS[3:]:
        apply_groups(original, grads)
        apply_groups(restored, grads)
        for name, value in original.values().items():
            np.testing.assert_array_equal(restored.values()[name], value)
    final = restored.state()
    for key, value in original.state().items():
        np.testing.assert_array_equal(final[key], value)


def test_groups_apply_the_documented_adam_per_variable():
    """The flat group's one fused step is the per-variable Adam of the reference."""
    spec = OptimizerSpec(kind="adam", lr=0.05)
    groups = make_groups(spec)
    for grads in GRADS:
        apply_groups(groups, grads)
    x, _, _ = ref_adam(spec, X0, GRADS)[-1]
    assert_close(list(groups.values().values()), x)


def test_in_place_reads_aligned_writable_memory_where_it_is_and_copies_the_rest():
    n = 1 << 15
    values = np.arange(n, dtype=np.float32)
    aligned = aligned_empty(n * 4).view(np.float32)
    aligned[:] = values
    tensor = in_place(aligned)
    aligned[0] = -1.0  # the tensor reads the array's own memory
    assert float(tensor[0]) == -1.0
    unaligned = aligned_empty(n * 4 + 4)[4:].view(np.float32)
    unaligned[:] = values
    read_only = np.frombuffer(values.tobytes(), np.float32)
    strided = np.repeat(values, 2)[::2]
    for array in (unaligned, read_only, strided):
        tensor = in_place(array)
        np.testing.assert_array_equal(tensor.numpy(), array)
        if array.flags.writeable:
            array[0] = -1.0  # a copy: the tensor keeps what it was given
            assert float(tensor[0]) == 0.0


def test_as_tensor_copies_arrays_of_its_dtype_once_and_converts_the_rest():
    for value in (
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=np.int64)[::2],  # not contiguous
        np.zeros((0, 3), np.float32),
        np.full((), 2.5, np.float32),  # 0-d
        np.arange(6, dtype=np.uint8),
    ):
        tensor = as_tensor(value, tf.as_dtype(value.dtype))
        assert tensor.dtype == tf.as_dtype(value.dtype) and tensor.shape == value.shape
        np.testing.assert_array_equal(tensor.numpy(), value)
        if value.size:
            before = value.copy()
            value[...] = 7  # the tensor has its own copy
            np.testing.assert_array_equal(tensor.numpy(), before)
    # Other dtypes, Python values, tensors: tf.convert_to_tensor, as before.
    assert as_tensor(np.arange(3), tf.float32).dtype == tf.float32
    assert as_tensor(np.array([True, False]), tf.bool).numpy().tolist() == [True, False]
    assert as_tensor([1.0, 2.0], tf.float32).numpy().tolist() == [1.0, 2.0]


def test_a_group_steps_alike_on_a_gradient_read_in_place_and_on_a_copied_one():
    n = 1 << 15
    start = {"w": np.linspace(-1, 1, n, dtype=np.float32)}
    grad = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    aligned = aligned_empty(n * 4).view(np.float32)
    aligned[:] = grad
    read_only = np.frombuffer(grad.tobytes(), np.float32)
    stepped = []
    for flat in (aligned, read_only):
        groups = OptimizerGroups(OptimizerSpec(kind="adam", lr=0.01), start)
        groups.apply_flat({"": flat})
        stepped.append(groups.values()["w"])
    np.testing.assert_array_equal(stepped[0], stepped[1])
    assert not np.array_equal(stepped[0], start["w"])


def test_state_is_a_copy():
    groups = make_groups(OptimizerSpec(kind="adam"))
    apply_groups(groups, GRADS[0])
    state = groups.state()
    saved = state["slot0/0"].copy()
    apply_groups(groups, GRADS[1])
    np.testing.assert_array_equal(state["slot0/0"], saved)
    assert int(state["step"]) == 1


def test_without_load_state_the_continuation_differs():
    """Guards the round-trip test: a fresh (unrestored) optimizer does not match."""
    spec = OptimizerSpec(kind="adam", lr=0.05)
    original = make_groups(spec)
    for grads in GRADS[:3]:
        apply_groups(original, grads)
    fresh = make_groups(spec, list(original.values().values()))
    apply_groups(original, GRADS[3])
    apply_groups(fresh, GRADS[3])
    assert not np.allclose(original.values()["v0"], fresh.values()["v0"], atol=1e-5)


# --- OptimizerSpec validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"kind": "adagrad"}, "unknown optimizer 'adagrad'"),
        ({"kind": "Adam"}, "unknown optimizer"),
        ({"lr": 0.0}, "invalid optimizer settings"),
        ({"lr": -1e-3}, "invalid optimizer settings"),
        ({"decay_steps": 0}, "invalid optimizer settings"),
        ({"decay_steps": -5}, "invalid optimizer settings"),
        ({"decay_rate": 0.0}, "invalid optimizer settings"),
        ({"decay_rate": -0.5}, "invalid optimizer settings"),
        ({"decay_rate": 1.5}, "invalid optimizer settings"),
    ],
)
def test_spec_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        OptimizerSpec(**changes)


@pytest.mark.parametrize(
    "changes", [{}, {"decay_rate": 1.0}, {"decay_steps": 1}, {"kind": "sgd", "lr": 10.0}]
)
def test_spec_accepts_valid_settings(changes):
    spec = OptimizerSpec(**changes)
    for key, value in changes.items():
        assert getattr(spec, key) == value


def test_apply_refuses_wrong_number_of_gradients():
    opt, _ = make(OptimizerSpec(kind="sgd"))
    with pytest.raises(ValueError):
        apply(opt, GRADS[0][:1])


@pytest.mark.parametrize(
    "kwargs",
    [{"lr": float("nan")}, {"beta1": 1.0}, {"beta2": float("nan")}, {"epsilon": 0.0}],
)
def test_spec_rejects_nan_and_degenerate_settings(kwargs):
    with pytest.raises(ValueError):
        OptimizerSpec(**kwargs)


def test_groups_step_only_the_groups_they_get_gradients_for():
    names = ["actor/w", "actor/b", "critic/w"]
    specs = {"actor/": OptimizerSpec(kind="adam", lr=0.1), "critic/": OptimizerSpec("sgd", lr=0.5)}
    groups = OptimizerGroups(specs, {n: np.ones(2, np.float32) for n in names})
    assert groups.members == {"actor/": ["actor/w", "actor/b"], "critic/": ["critic/w"]}
    g = np.array([1.0, -2.0], np.float32)
    groups.apply({"critic/w": g})  # the actor gets no gradient: Adam must not move it
    np.testing.assert_allclose(groups.values()["critic/w"], 1 - 0.5 * g)
    np.testing.assert_allclose(groups.values()["actor/w"], 1.0)
    groups.apply({"actor/w": g, "actor/b": g, "critic/w": g})
    # First Adam step moves each coordinate by lr against the gradient's sign.
    np.testing.assert_allclose(groups.values()["actor/w"], 1 - 0.1 * np.sign(g), rtol=1e-5)
    assert list(groups.values()) == names  # in the order given
    state = groups.state()
    assert int(state["actor/step"]) == 1 and int(state["critic/step"]) == 2
    with pytest.raises(ValueError, match="lack"):
        groups.apply({"actor/w": g})
    other = OptimizerGroups(specs, groups.values())
    other.load_state(state)
    assert {k: np.asarray(v).tolist() for k, v in other.state().items()} == {
        k: np.asarray(v).tolist() for k, v in state.items()
    }
    other.assign({n: np.full(2, 3.0, np.float32) for n in names})
    assert all(v.tolist() == [3.0, 3.0] for v in other.values().values())


def test_every_variable_needs_exactly_one_group():
    variables = {"actor/w": np.ones(1, np.float32), "other/w": np.ones(1, np.float32)}
    with pytest.raises(ValueError, match="'other/w' matches optimizer groups \\[\\]"):
        OptimizerGroups({"actor/": OptimizerSpec()}, variables)
    with pytest.raises(ValueError, match="matches optimizer groups"):
        OptimizerGroups({"": OptimizerSpec(), "actor/": OptimizerSpec()}, variables)


def shard_of(values: dict, names: list[str]) -> dict:
    return {n: values[n] for n in names}


@pytest.mark.parametrize(
    "specs",
    [
        OptimizerSpec(kind="sgd", lr=0.1),
        {
            "actor/": OptimizerSpec(kind="adam", lr=0.01, schedule="polynomial", decay_steps=3),
            "critic/": OptimizerSpec(kind="rmsprop", lr=0.001),
        },
    ],
)
def test_a_learners_local_optimizer_steps_as_the_ps_shards_would(specs):
    """A learner that applies its own updates (LocalOptimizer) moves its variables exactly as
    PS shards holding them would (two shards here, a group split across them), partial
    updates (one group only) included, and its state per shard is the shards' own."""
    rng = np.random.default_rng(3)
    names = ["actor/w", "actor/b", "critic/w", "critic/b"]
    shapes = {"actor/w": (3, 2), "actor/b": (2,), "critic/w": (4, 1), "critic/b": (1,)}
    values = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names}
    shards = [["actor/b", "critic/w"], ["actor/w", "critic/b"]]  # sorted within a shard
    if isinstance(specs, OptimizerSpec):
        specs = {"actor/": specs, "critic/": specs}
    ps = [OptimizerGroups(specs, shard_of(values, s)) for s in shards]
    variables = {n: tf.Variable(values[n]) for n in names}
    local = LocalOptimizer(specs, variables)
    for step in range(5):
        grads = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names}
        if step == 2:  # the critic alone (TD3 between its actor's updates)
            grads = {n: g for n, g in grads.items() if n.startswith("critic/")}
        assert local.apply([grads.get(n) for n in names])
        for shard, names_ in zip(ps, shards, strict=True):
            shard.apply({n: grads[n] for n in names_ if n in grads})
    for shard, names_ in zip(ps, shards, strict=True):
        for name, value in shard.values().items():
            np.testing.assert_array_equal(variables[name].numpy(), value, err_msg=name)
        expected, got = shard.state(), local.state(names_)
        assert sorted(got) == sorted(expected)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)

    # A new learner that loads the shards' states continues exactly as the shards do.
    again = {n: tf.Variable(variables[n].numpy()) for n in names}
    restarted = LocalOptimizer(specs, again)
    for shard, names_ in zip(ps, shards, strict=True):
        restarted.load_state(names_, shard.state())
    grads = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names}
    local.apply([grads[n] for n in names])
    restarted.apply([grads[n] for n in names])
    for name in names:
        np.testing.assert_array_equal(again[name].numpy(), variables[name].numpy(), err_msg=name)


def test_load_state_checks_the_whole_state_before_changing_anything():
    groups = make_groups(OptimizerSpec(kind="adam"))
    apply_groups(groups, [np.ones_like(x) for x in X0])
    before = groups.state()
    broken = dict(before)
    broken["slot1/1"] = np.zeros((7,), np.float32)  # wrong shape, after a good slot 0
    with pytest.raises(ValueError, match="slot1/1: shape"):
        groups.load_state(broken)
    missing = {k: v for k, v in before.items() if k != "step"}
    with pytest.raises(ValueError, match="lacks 'step'"):
        groups.load_state(missing)
    for key, value in groups.state().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_a_learners_load_state_checks_the_whole_state_before_changing_anything():
    specs = {"actor/": OptimizerSpec(kind="adam"), "critic/": OptimizerSpec(kind="adam")}
    names = ["actor/w", "critic/w"]
    variables = {n: tf.Variable(np.ones((3, 2), np.float32)) for n in names}
    local = LocalOptimizer(specs, variables)
    local.apply([np.ones((3, 2), np.float32) for _ in names])
    before = local.state(names)
    broken = {**before, "critic/slot1/0": np.zeros((7,), np.float32)}  # after good actor/ keys
    with pytest.raises(ValueError, match="critic/slot1/0: shape"):
        local.load_state(names, {**broken, "actor/step": np.int64(99)})
    with pytest.raises(ValueError, match="lacks 'critic/step'"):
        local.load_state(names, {k: v for k, v in before.items() if k != "critic/step"})
    for key, value in local.state(names).items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_a_learners_local_optimizer_takes_a_gradient_tensor_and_drops_a_non_finite_update():
    """The flat tensor of an agent's step (`FlatGradients`) steps the variables as the same
    gradients as arrays do; an update with a non-finite gradient in any group it covers
    changes nothing (values, slots, steps) and says so; a tensor laid out otherwise is
    refused."""
    specs = {"actor/": OptimizerSpec(kind="adam", lr=0.1), "critic/": OptimizerSpec(kind="adam")}
    names = ["actor/b", "actor/w", "critic/w"]
    shapes = [(2,), (3, 2), (4, 1)]
    rng = np.random.default_rng(5)
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    by_arrays = {n: tf.Variable(v) for n, v in zip(names, start, strict=True)}
    by_tensor = {n: tf.Variable(v) for n, v in zip(names, start, strict=True)}
    arrays_opt, tensor_opt = LocalOptimizer(specs, by_arrays), LocalOptimizer(specs, by_tensor)
    layout = FlatVariables(list(by_tensor.values()))
    for absent in [(), (0, 1)]:  # every group; the critic alone
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        flat = tf.constant(np.concatenate([g.ravel() for g in grads]))
        assert tensor_opt.apply(FlatGradients(flat, layout, absent))
        assert arrays_opt.apply([None if i in absent else g for i, g in enumerate(grads)])
    for name in names:
        np.testing.assert_array_equal(by_tensor[name].numpy(), by_arrays[name].numpy())
    assert tensor_opt.state(names)["actor/step"] == 1
    assert tensor_opt.state(names)["critic/step"] == 2

    before = ({n: v.numpy() for n, v in by_tensor.items()}, tensor_opt.state(names))
    grads = [np.ones(s, np.float32) for s in shapes]
    grads[2][1, 0] = np.nan  # the critic's; the actor's are finite
    assert not tensor_opt.apply(
        FlatGradients(tf.constant(np.concatenate([g.ravel() for g in grads])), layout)
    )
    assert not tensor_opt.apply(grads)
    grads[2][1, 0] = 1.0
    grads[0][0] = np.inf  # the actor's, with the critic left alone: still dropped
    assert not tensor_opt.apply([grads[0], grads[1], None])
    for name in names:
        np.testing.assert_array_equal(by_tensor[name].numpy(), before[0][name])
    for key, value in tensor_opt.state(names).items():
        np.testing.assert_array_equal(value, before[1][key], err_msg=key)

    other = FlatVariables([tf.Variable(np.zeros(s, np.float32)) for s in reversed(shapes)])
    with pytest.raises(ValueError, match="laid out unlike"):
        tensor_opt.apply(FlatGradients(tf.zeros([other.size]), other))
    with pytest.raises(ValueError, match="lack"):
        tensor_opt.apply([grads[0], None, grads[2]])  # half the actor's group


def test_flat_gradients_read_as_the_list_of_arrays_they_replace():
    """`FlatGradients` is what an agent's `learn` returns in place of a list: indexing,
    slicing and iteration give the variables' arrays in order (None where absent), split
    once."""
    shapes = [(2,), (3, 2), (4, 1)]
    layout = FlatVariables([tf.Variable(np.zeros(s, np.float32)) for s in shapes])
    values = np.arange(layout.size, dtype=np.float32)
    grads = FlatGradients(tf.constant(values), layout, absent=[1])
    assert len(grads) == 3 and grads[1] is None and grads[1:] == [None, grads[2]]
    np.testing.assert_array_equal(grads[0], values[:2])
    np.testing.assert_array_equal(grads[2], values[8:].reshape(4, 1))
    listed = [None] * 4
    listed[1:] = grads  # a multi-agent step assembles its policies' gradients so
    assert listed[2] is None and listed[3] is grads[2]
    assert grads.arrays() is grads.arrays()  # split once
