"""Tests of easyrl.roles.learner against real PS and memory shards on loopback."""

import threading
import time
from pathlib import Path

from conftest import RoleServers

from easyrl import config as config_lib
from easyrl.roles.common import StopSignal
from easyrl.roles.learner import Learner

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
