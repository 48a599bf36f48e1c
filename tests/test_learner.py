"""Tests of easyrl.roles.learner against real PS and memory shards on loopback."""

import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RoleServers

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.envs import env_options, env_spaces
from easyrl.errors import ReplayError
from easyrl.roles import memory as memory_role
from easyrl.roles.common import StopSignal, guarded
from easyrl.roles.learner import Learner
from easyrl.roles.push_queue import QUEUE_PUSHES

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole_apex.yaml"


def test_a_learner_starved_of_samples_still_learns_that_the_run_is_stopping(role_servers):
    """The actors stopped and the memory has nothing to sample (here: nothing inserted; in a
    run: the rate limiter holds samples back once inserts stop). The learner takes no batch,
    yet still reports to PS shard 0 and exits when the run stops, instead of waiting forever
    (it hung a multi-host CI run this way)."""
    cfg = config_lib.load(CONFIG, ["env.num_envs=1"])
    shards = role_servers.start(cfg, token="learner-test-token")
    stop = StopSignal()
    learner = Learner(shards.ctx, shards.ctx.build_algorithm(learner=True), stop)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not RoleServers.state(shards.ps)["initialized"]:
            assert time.monotonic() < deadline, "the chief learner never initialized the PS"
            time.sleep(0.05)
        shards.ps.stopping.set()
        thread.join(timeout=10)
        assert not thread.is_alive(), "the learner kept waiting for samples"
        assert stop.is_set() and not stop.error
        assert learner.updates == 0 and shards.memory.table.inserted == 0
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_priority_update_past_its_deadline_is_dropped_and_the_learner_goes_on(role_servers):
    """A memory shard whose table thread is busy for longer than the RPC deadline (it copies
    a snapshot of a large Atari table, on 2 starved cores: a real Ape-X Pong run's learner
    died of this) costs those items their new priorities, not the learner."""
    cfg = config_lib.load(CONFIG, ["env.num_envs=1", "run.rpc_timeout_s=0.5"])
    shards = role_servers.start(cfg, token="learner-test-token")
    stop = StopSignal()
    learner = Learner(shards.ctx, shards.ctx.build_algorithm(learner=True), stop)
    busy, run_op = threading.Event(), shards.memory._try
    busy.set()

    def slow(op):
        if op.kind == "update" and busy.is_set():
            time.sleep(1.5)
        return run_op(op)

    shards.memory._try = slow  # the table thread looks it up for every operation
    spec = shards.memory.table.spec
    assert learner.memories[0].insert(RoleServers.items(spec, 0, 4))  # keys 0-3 issued
    thread = threading.Thread(target=guarded, args=(learner.priority_loop, stop), daemon=True)
    thread.start()
    try:
        keys, priorities = np.arange(4, dtype=np.int64), np.full(4, 2.0)
        learner.priorities.put((0, keys, priorities))
        deadline = time.monotonic() + 10
        while learner.counters["dropped_priority_updates"] < 1:
            assert time.monotonic() < deadline and not stop.is_set(), stop.error
            time.sleep(0.05)
        # The shard still applies it when its table thread gets to it: the learner just
        # did not wait. Then the shard answers in time again, and updates go through.
        while shards.memory.counters["priority_updates"] < 4:
            assert time.monotonic() < deadline and not stop.is_set(), stop.error
            time.sleep(0.05)
        busy.clear()
        learner.priorities.put((0, keys, priorities))
        while shards.memory.counters["priority_updates"] < 8:
            assert time.monotonic() < deadline and not stop.is_set(), stop.error
            time.sleep(0.05)
        assert thread.is_alive() and not stop.is_set()
        assert learner.counters["dropped_priority_updates"] == 1
    finally:
        stop.set()
        thread.join(timeout=10)
        shards.memory._try = run_op


def test_a_learner_keeps_computing_while_its_pushes_wait_for_the_ps(role_servers):
    """The PS shard applies nothing for a while (its apply thread is held back): the learner
    still computes the next updates, up to a bound on the pushes in flight (the shard's queue,
    the push threads, the push queue, the update being computed and one the apply thread
    took before it was held), then waits. Once the
    shard goes on, every push it accepted is applied, each drop is counted on both sides,
    and the staleness the shard counts includes the pushes queued ahead of each."""
    # push every update (what several learners do)
    cfg, shards, learner = learner_with_items(role_servers, publish_every=0)
    ps, stop = shards.ps, learner.stop
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: ps.counters["applied"] >= 3, stop)
        bound = QUEUE_PUSHES + cfg.learner.push_threads + cfg.learner.push_queue + 2
        gate, at_gate, oldest = threading.Event(), threading.Event(), ps._queue.oldest

        def held():  # the apply thread's next push
            at_gate.set()
            return gate.wait() and oldest()

        ps._queue.oldest = held
        before = learner.updates
        try:
            # No sleep decides anything: the learner fills the shard's queue however slowly
            # it computes, then stops once every place a push can wait is full; the push the
            # apply thread took before it was held is applied by then (the version settles).
            wait_until(lambda: at_gate.is_set() and len(ps._queue) == QUEUE_PUSHES, stop)
            version = ps.version
            # settled: the learner's next push waited on a full queue (its update counter
            # already counts every update before it)
            blocked, put = threading.Event(), learner.pushes.put

            def put_or_flag(item, block=True, timeout=None):
                try:
                    return put(item, block, timeout)
                except queue.Full:
                    blocked.set()
                    raise

            learner.pushes.put = put_or_flag
            wait_until(blocked.is_set, stop)
            settled = learner.updates
            time.sleep(0.5)
            during = learner.updates - before
            assert learner.updates == settled and ps.version == version
            assert len(ps._queue) == QUEUE_PUSHES
        finally:
            gate.set()
            ps._queue.oldest = oldest
        assert 1 <= during <= bound, (during, bound)
        wait_until(lambda: ps.version >= version + QUEUE_PUSHES, stop)
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive() and not stop.error
    wait_until(lambda: len(ps._queue) == 0, StopSignal())
    c = ps.counters
    assert c["pushes"] == c["applied"] + c["dropped_stale"] + c["dropped_nonfinite"]
    assert c["pushes"] <= learner.updates
    assert learner.counters["dropped_stale"] == c["dropped_stale"]
    assert learner.counters["dropped_nonfinite"] == c["dropped_nonfinite"]
    # The pushes queued behind the held thread were applied to values 1, 2, ... versions
    # newer than those they were computed against.
    assert c["staleness_sum"] >= sum(range(min(during, QUEUE_PUSHES)))


def test_a_lone_learner_applies_its_updates_and_publishes_them_to_the_ps(role_servers):
    """One learner: no push per update. It applies its updates itself, publishes values every
    `publish_every` updates and its optimizer state when it stops; a learner started after it
    (a restart) begins from exactly those values and that state."""
    _, shards, learner = learner_with_items(role_servers, publish_every=3)
    ps, stop = shards.ps, learner.stop
    assert learner.publisher is not None and learner.publisher.every == 3
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: ps.version >= 4, stop)  # the chief's Assign and 3 publishes
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive() and not stop.error
    assert ps.counters["pushes"] == 0 and learner.updates >= 9
    assert ps.counters["applied"] == learner.publisher.applied == learner.updates
    assert learner.publisher.published >= 4  # ... the last one when it stopped
    local = {n: v.numpy() for n, v in learner.algo.variables.items()}
    restarted = Learner(shards.ctx, shards.ctx.build_algorithm(learner=True), StopSignal())
    assert restarted.publisher is not None
    restarted.publisher.load()
    for name, variable in restarted.algo.variables.items():
        np.testing.assert_array_equal(variable.numpy(), local[name], err_msg=name)
    (optimizer,) = restarted.publisher.optimizer.optimizers.values()  # DQN: one group
    assert int(optimizer.step.numpy()) == learner.updates - learner.counters["dropped_nonfinite"]
    (mine,) = learner.publisher.optimizer.optimizers.values()
    for got, expected in zip(optimizer.slots[0], mine.slots[0], strict=True):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_a_learner_takes_several_batches_per_sample_and_learns_on_each(role_servers):
    """`learner.batches_per_sample: 4`: one Sample of 4 x 32 items, four updates of 32, each
    batch's priorities back to the shard under its own keys."""
    _, shards, learner = learner_with_items(role_servers, 1, ["learner.batches_per_sample=4"])
    memory, stop, learned = shards.memory, learner.stop, []
    algo: Any = learner.algo  # a DQN agent (a ReplayLearner)
    learn = algo.learn

    def recording(batch, weights):
        learned.append((len(batch["action"]), len(weights)))
        return learn(batch, weights)

    algo.learn = recording
    sent = []  # (keys, how many of them the shard updated)
    update = learner.memories[0].update_priorities

    def updating(keys, priorities):
        sent.append((len(keys), update(keys, priorities)))
        return sent[-1][1]

    learner.memories[0].update_priorities = updating
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: learner.updates >= 12, stop)
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive() and not stop.error
    assert memory.table.batch_size == 128  # what the shard samples ahead
    assert set(learned) == {(32, 32)}
    assert memory.counters["samples"] % 128 == 0
    assert memory.counters["samples"] >= 32 * learner.updates
    assert memory.table.batches * 128 == memory.counters["samples"]
    sent_keys, updated = np.sum(sent, axis=0)
    assert sent_keys == updated >= 32 * (learner.updates - 4)


def test_batches_per_sample_past_the_rate_limiter_window_names_the_key():
    cfg = config_lib.load(
        CONFIG,
        ["algorithm.batch_size=32", "replay.error_buffer=40", "learner.batches_per_sample=4"],
    )
    spec = registry.replay_spec(cfg, *env_spaces(cfg.env.id, **env_options(cfg.env)))
    with pytest.raises(ReplayError, match="learner.batches_per_sample"):
        memory_role.build(cfg, spec, 0)


def learner_with_items(role_servers, publish_every: int, overrides=()):
    """(config, servers, learner) of a DQN CartPole learner (not started) with
    `learner.publish_every` (and `overrides`) and 128 items in its memory shard."""
    cfg = config_lib.load(
        CONFIG,
        [
            "env.num_envs=1",
            "algorithm.batch_size=32",
            "replay.min_size_to_sample=64",
            "replay.samples_per_insert=null",
            "replay.error_buffer=null",
            f"learner.publish_every={publish_every}",
            *overrides,
        ],
    )
    shards = role_servers.start(cfg, token="learner-test-token")
    learner = Learner(shards.ctx, shards.ctx.build_algorithm(learner=True), StopSignal())
    items = RoleServers.items(shards.memory.table.spec, 0, 128)
    items["action"] %= 2  # CartPole's actions
    assert learner.memories[0].insert(items)
    return cfg, shards, learner


def wait_until(condition, stop: StopSignal, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline and not stop.error, stop.error
        time.sleep(0.02)
