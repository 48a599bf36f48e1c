"""A learner that applies its own updates: no round trip to the PS per update.

With one learner in a replay flow (`learner.publish_every` > 0), nobody else changes the
values: pushing every update's gradients to the PS shards and pulling the applied values back
buys nothing but the transport (issue 45: the SAC learner spent more CPU on it than on its
gradient step). The learner applies each update to its own variables with the optimizer the
shards would have used (`LocalOptimizer`, same groups, learning-rate schedules and step
counters), and a publisher thread writes the values to the shards every `publish_every`
updates (an `Assign`: the shard's version moves on by one per publish, so actors and
evaluators pull exactly as before), with the optimizer state every `STATE_EVERY_S` seconds
and when the learner stops, so the shards' checkpoints hold it and a restarted learner (or a
resumed run) starts from the shards' values and state. The gradients of an agent whose
step returns one flat tensor (`FlatGradients`: DQN, BCQ, IMPALA, SAC, R2D2, MARWIL/BC) stay in
TensorFlow, on the device that computed them: the finiteness check and the optimizer step are
one compiled call on that tensor (copying them to numpy, checking and regrouping them there
took ~0.5 ms of SAC's ~6 ms update on 2 cores), and those agents take that call into their
own step (`FusingLearner.fuse_update`, called by the learner's loop): one call per update.

What a run with several learners does is unchanged: each update's gradients go to the shards,
pipelined, with their staleness counted (`easyrl.flows.async_replay`). With one learner the
staleness of every update is 0 by construction; non-finite gradients are dropped and counted
(`dropped_nonfinite`) here, as a shard would. A learner killed between two publishes loses
at most the updates since the last one (it restarts from the shards' values and state).
"""

import logging
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from easyrl.algorithms.optimizers import LocalOptimizer
from easyrl.errors import TransportError
from easyrl.models.flat import FlatVariables
from easyrl.roles.common import ShardedWeights

log = logging.getLogger(__name__)

STATE_EVERY_S = 10.0
"""Seconds between publishes that carry the optimizer state (it is twice the values' size for
Adam; the values go every `publish_every` updates)."""


class Snapshot(NamedTuple):
    """What the update loop copied at one instant for the publisher thread."""

    shards: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]]
    """Per shard: (values, optimizer state or None)."""
    applied: int
    """Updates the learner had applied (the shards count them as applied when published)."""


class Publisher:
    """The local optimizer and the thread that publishes its results (module docstring).

    Args:
        weights: the learner's view of the PS shards (clients, which variable lives where).
        optimizer: the algorithm's optimizer spec(s), as the PS shards get them.
        every: publish every this many updates (>= 1).
    """

    def __init__(self, weights: ShardedWeights, optimizer, every: int):
        if every < 1:
            raise ValueError("publish_every must be >= 1")
        self.weights = weights
        self.optimizer = LocalOptimizer(optimizer, dict(weights.variables))
        self.every = every
        self.published = 0
        """Publishes every shard has taken."""
        self.applied = 0
        """Updates applied to the learner's variables (non-finite ones are dropped)."""
        self._counted = 0  # of them, what the shards have counted
        self._slot: Snapshot | None = None  # the newest snapshot not yet published
        self._changed = threading.Condition()
        self._state_at = time.monotonic()
        # Each shard's values read in one compiled call (one eager read per variable took
        # ~8 % of a SAC learner's main thread at publish_every 16).
        self._values = [
            FlatVariables([weights.variables[n] for n in names]) for names in weights.shard_names
        ]

    def load(self) -> None:
        """Loads the shards' values and optimizer state into the learner (at start: a fresh
        run's chief-assigned values and zero state, or what a restarted shard restored)."""
        for shard, client in enumerate(self.weights.clients):
            pulled = client.pull(optimizer_state=True)
            names = self.weights.shard_names[shard]
            if pulled.values is None or sorted(pulled.values) != names:
                raise TransportError(f"PS shard {shard} holds unexpected variables")
            for name in names:
                self.weights.variables[name].assign(pulled.values[name])
            if pulled.optimizer_state:
                self.optimizer.load_state(names, pulled.optimizer_state)

    def apply(self, grads: Sequence[np.ndarray | None], updates: int, counters: dict) -> None:
        """Applies one update's gradients (in the order of the variables, None for one the
        update leaves alone; a `FlatGradients` stays in TensorFlow) to the learner's
        variables, or drops them when one is not finite (counted in
        `counters["dropped_nonfinite"]`); every `every` updates (`updates` counts them, this
        one included) hands a snapshot to the publisher thread, replacing one it has not
        taken yet."""
        if self.optimizer.apply(grads):
            self.applied += 1
        else:
            counters["dropped_nonfinite"] += 1
        if updates % self.every == 0:
            with_state = time.monotonic() - self._state_at >= STATE_EVERY_S
            self.offer(self.snapshot(with_state))

    def snapshot(self, with_state: bool) -> Snapshot:
        """Copies the values (and the optimizer state) of every shard's variables."""
        if with_state:
            self._state_at = time.monotonic()
        shards = [
            (
                dict(zip(names, values.split(values.read().numpy()), strict=True)),
                self.optimizer.state(names) if with_state else None,
            )
            for names, values in zip(self.weights.shard_names, self._values, strict=True)
        ]
        return Snapshot(shards, self.applied)

    def offer(self, snapshot: Snapshot) -> None:
        """Puts `snapshot` in the slot the publisher thread takes from. A snapshot with
        state is not replaced by one without: the state would wait another period."""
        with self._changed:
            if self._slot is not None and self._slot.shards[0][1] is not None:
                pairs = zip(snapshot.shards, self._slot.shards, strict=True)
                shards = [(v, s if s is not None else old[1]) for (v, s), old in pairs]
                snapshot = Snapshot(shards, snapshot.applied)
            self._slot = snapshot
            self._changed.notify()

    def loop(self, stop: threading.Event) -> None:
        """The publisher thread: writes each snapshot to every shard until `stop`."""
        while not stop.is_set():
            with self._changed:
                if self._slot is None:
                    self._changed.wait(0.1)
                snapshot, self._slot = self._slot, None
            if snapshot is not None:
                self.publish(snapshot)

    def publish(self, snapshot: Snapshot) -> None:
        """Writes `snapshot` to every shard (one Assign each), with the updates it adds."""
        updates = snapshot.applied - self._counted
        for client, (values, state) in zip(self.weights.clients, snapshot.shards, strict=True):
            client.assign(values, optimizer_state=state, updates=updates)
        self._counted = snapshot.applied
        self.published += 1

    def flush(self) -> None:
        """The learner stops: publishes the newest values and state, if the shards still
        answer (a run that is stopping may have shut them down already: logged)."""
        try:
            self.publish(self.snapshot(with_state=True))
        except TransportError as err:
            log.warning("last publish to the PS shards failed: %s", err)
