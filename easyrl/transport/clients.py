"""Typed clients of the PS and memory shards: numpy arrays and plain values in, plain values
or small typed results out; the protobuf messages and the codec stay here. Each client wraps
an `rpc.Client`, which does the token, deadlines, retries and TLS.
"""

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Unpack

import numpy as np

from easyrl.metrics import StopKind
from easyrl.replay.sampled import NotReady, Sampled
from easyrl.transport import codec, local, rpc, shm
from easyrl.transport import easyrl_pb2 as pb

if TYPE_CHECKING:
    from easyrl.config import SecurityConfig


class Status(NamedTuple):
    """A shard's status: its counters, and (PS shard 0) whether and why the run stops."""

    version: int
    stopping: bool
    stop_reason: str
    counters: dict[str, float]
    elapsed_s: float
    """The run clock (PS shard 0; 0 elsewhere): what metrics and stop conditions read."""
    stop_kind: StopKind | None
    """The stop condition met (PS shard 0), None while running or when stopped by Shutdown."""


class Pulled(NamedTuple):
    """A PS shard's `version` (0: no values yet), newest published `round` and values
    ({name: array}; None when the caller already holds `version`)."""

    version: int
    round: int
    values: dict[str, np.ndarray] | None
    optimizer_state: dict[str, np.ndarray] | None = None
    """With `pull(optimizer_state=True)`: the shard's optimizer state."""


class Pushed(NamedTuple):
    """A push's outcome: the shard's newest applied `version`, whether the push is `applied`
    or `queued` (accepted, applied after the pushes queued before it), why it was dropped
    otherwise ("stale", "non-finite", "ahead") and, when asked for and not dropped, the values
    at `version`."""

    version: int
    applied: bool
    reason: str
    values: dict[str, np.ndarray]
    queued: bool = False

    @property
    def accepted(self) -> bool:
        """Whether the shard applied the push or will apply it."""
        return self.applied or self.queued


class Counts(TypedDict, total=False):
    """What a report to PS shard 0 carries: counts since the last report, finished
    episodes (with their policies in a multi-agent run), an evaluation's returns and
    stats."""

    env_steps: int
    updates: int
    episode_returns: Sequence[float]
    episode_lengths: Sequence[int]
    episode_policies: Sequence[str]
    eval_returns: Sequence[float]
    stats: Mapping[str, float]


class ShardClient:
    """What both clients share: the wrapped `rpc.Client` (`call` is its raw call, for
    hand-made messages), `address`, `serving`, `close`, `status` and `shutdown`.

    Args:
        client: the wrapped `rpc.Client`.
        shm_prefix: the run's segment prefix (`shm.run_prefix`) when the server is on this
            host and may write reply bodies (a Sample's batch, a Pull's values) into this
            client's shared memory (`easyrl.transport.shm`); None: every body comes over
            gRPC.
    """

    ROLE = ""
    """The server's role ("ps", "memory"): which of its calls a local connection serves."""

    def __init__(self, client: rpc.Client, shm_prefix: str | None = None):
        self.rpc, self.address, self.call = client, client.address, client.call
        self.serving = client.serving
        self.shared = None if shm_prefix is None else shm.SharedReplies(shm_prefix)
        self.local = None
        """With shared memory: the calls whose body lies in the segment go to the server's
        local listener (`easyrl.transport.local`)."""
        if shm_prefix is not None and self.ROLE:
            self.local = local.LocalCaller(self.ROLE, shm_prefix, client.address, client.token)

    def shared_call(self, method: str, request) -> tuple:
        """(reply, body) of a call whose reply body may come through shared memory."""
        if self.shared is None:
            reply = self.call(method, request)
            return reply, reply.body
        try:
            return self.shared.call(self._send, method, request)
        except local.Broken:
            return self.shared.call(self.call, method, request)

    def shared_send(self, method: str, framed, lend: bool = False) -> Any:
        """The reply of a call whose request body (`codec.Framed`) may go through shared
        memory (lent with `lend`: `shm.SharedReplies.send`)."""
        if self.shared is None:
            return self.call(method, framed)
        try:
            return self.shared.send(self._send, method, framed, lend)
        except local.Broken:
            return self.shared.send(self.call, method, framed, lend)

    def _send(self, method: str, message) -> Any:
        """A call naming this client's segment (its body lies there, or its reply's may)
        goes over the local connection when the server has one; any other over gRPC.

        Raises:
            local.Broken: the local connection broke once the call was sent (the segment
                the call named is dropped; the caller makes the call again over gRPC).
        """
        if self.local is None or not getattr(message, "shm_name", ""):
            return self.call(method, message)
        return self.local.call(self.call, method, message, self.rpc.timeout_s)

    @property
    def shm_requests(self) -> int:
        """Requests whose body went through shared memory."""
        return 0 if self.shared is None else self.shared.requests

    @property
    def shm_replies(self) -> int:
        """Replies whose body came through shared memory."""
        return 0 if self.shared is None else self.shared.replies

    def close(self) -> None:
        """Closes the channel (and the local connection) and unlinks this client's segment."""
        self.rpc.close()
        if self.local is not None:
            self.local.close()
        if self.shared is not None:
            self.shared.close()

    def status(self) -> Status:
        reply = self.call("Status", pb.StatusRequest())
        counters = dict(reply.counters)
        kind = None
        if reply.stop_kind:  # STOP_NONE is 0
            kind = StopKind[pb.StopKind.Name(reply.stop_kind).removeprefix("STOP_")]
        return Status(
            reply.version, reply.stopping, reply.stop_reason, counters, reply.elapsed_s, kind
        )

    def shutdown(self) -> None:
        """Asks the shard to checkpoint (PS) and exit."""
        self.call("Shutdown", pb.ShutdownRequest())


class ParameterClient(ShardClient):
    """A client of one PS shard."""

    ROLE = "ps"

    def pull(
        self,
        known_version: int = -1,
        min_round: int = 0,
        wait_s: float = 0.0,
        optimizer_state: bool = False,
    ) -> Pulled:
        """The values unless the caller holds `known_version`; with `min_round`, the shard
        first waits up to `wait_s` seconds until it has published that round; with
        `optimizer_state`, the values and the shard's optimizer state (once it holds values)."""
        request = pb.PullRequest(
            known_version=known_version,
            min_round=min_round,
            wait_s=wait_s,
            optimizer_state=optimizer_state,
        )
        reply, body = self.shared_call("Pull", request)
        values = None if reply.current else codec.decode_named(reply.tensors, body)
        state = codec.decode_named(reply.optimizer_state, body) if optimizer_state else None
        return Pulled(reply.version, reply.round, values, state)

    def push(
        self, version: int, grads: Mapping, learner: int = 0, values=True, wait=False
    ) -> Pushed:
        """Pushes gradients computed against `version` (by `learner`, for the shard's logs).
        The shard answers once it accepted the push (checked and queued: `queued`), or with
        `wait` once it applied it (`applied`); with `values`, an accepted push returns the
        shard's newest values (saves the pusher a Pull; with `wait` they include this push)."""
        body = codec.Body()
        request = pb.PushRequest(
            version=version,
            gradients=body.named(grads),
            learner=learner,
            return_values=values,
            queue=not wait,
        )
        reply = self.shared_send("Push", body.frame(request), lend=True)
        values_ = codec.decode_named(reply.tensors, reply.body)
        return Pushed(reply.version, reply.applied, reply.reason, values_, reply.queued)

    def assign(
        self,
        values: Mapping[str, np.ndarray],
        only_if_empty: bool = False,
        optimizer_state: Mapping[str, np.ndarray] | None = None,
        updates: int = 0,
    ) -> int:
        """Writes `values` (and, given, the optimizer state, in the shard's checkpoint
        format; `updates`: how many updates of a learner that applies its own these values
        add, which the shard counts as applied); returns the shard's new version, or 0 when
        `only_if_empty` and the shard already held values (nothing assigned)."""
        body = codec.Body()
        request = pb.AssignRequest(
            tensors=body.named(values),
            only_if_empty=only_if_empty,
            optimizer_state=body.named(optimizer_state or {}),
            updates=updates,
        )
        reply = self.call("Assign", body.frame(request))
        return reply.version if reply.assigned else 0

    def report(self, role: str, task: int, **counts: Unpack[Counts]) -> bool:
        """Reports to PS shard 0 as `task` of `role`; returns whether the run is stopping.
        Non-finite stats (a diverged loss) are left out: PS shard 0 refuses them."""
        if "stats" in counts:
            counts["stats"] = {k: v for k, v in counts["stats"].items() if math.isfinite(v)}
        return self.call("Report", pb.ReportRequest(role=role, task=task, **counts)).stopping

    def publish_round(self, round_: int) -> bool:
        """Publishes the shard's current values as round `round_` (synchronous rounds);
        returns whether the run is stopping."""
        return self.call("PublishRound", pb.PublishRoundRequest(round=round_)).stopping


class MemoryClient(ShardClient):
    """A client of one memory shard (sampled batches through shared memory with a
    `shm_prefix`, see `ShardClient`)."""

    ROLE = "memory"

    def __init__(self, client: rpc.Client, shm_prefix: str | None = None):
        super().__init__(client, shm_prefix)

    def insert(
        self,
        batch: Mapping,
        priorities=None,
        actor: int = 0,
        round_: int = 0,
        sender: int = 0,
        sequence: int = 0,
    ) -> bool:
        """Inserts the items of a (nested) batch with initial priorities (None: the max),
        tagged with the weight round they were collected under; returns False when an
        aggregate table refused them (their round was already released). `sender` and
        `sequence` make a resent insert count once (see `InsertRequest`; 0: no check)."""
        body = codec.Body()
        request = pb.InsertRequest(
            tensors=body.batch(batch), actor=actor, round=round_, sender=sender, sequence=sequence
        )
        if priorities is not None:
            request.priorities.CopyFrom(body.tensor("priorities", priorities))
        return not self.shared_send("Insert", body.frame(request)).refused

    def sample(self, batch_size: int, timeout_s: float) -> Sampled | None:
        """A sampled batch (items, keys, importance weights), or None when the rate limiter
        did not allow a sample within `timeout_s`."""
        request = pb.SampleRequest(batch_size=batch_size, timeout_s=timeout_s)
        reply, body = self.shared_call("Sample", request)
        if not reply.ready:
            return None
        return Sampled(
            data=codec.decode_batch(reply.tensors, body),
            keys=codec.decode_array(reply.keys, body),
            weights=codec.decode_array(reply.weights, body),
        )

    def take_round(self, round_: int, timeout_s: float) -> Sampled | NotReady:
        """All of round `round_` once it is complete (waiting up to `timeout_s`), or what the
        shard says instead: the round it collects (newer: the caller is behind) and whether a
        restart lost part of the one asked for."""
        reply = self.call("Sample", pb.SampleRequest(round=round_, timeout_s=timeout_s))
        if not reply.ready:
            return NotReady(reply.round, reply.incomplete)
        return Sampled(codec.decode_batch(reply.tensors, reply.body), round=reply.round)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Sets the priorities of sampled keys; returns how many were still in the table."""
        body = codec.Body()
        request = pb.UpdatePrioritiesRequest(
            keys=body.tensor("keys", keys), priorities=body.tensor("priorities", priorities)
        )
        return self.call("UpdatePriorities", body.frame(request)).updated


def connect(
    role: str,
    address: str,
    token: str | None,
    sec: "SecurityConfig",
    shared_memory: bool = False,
    **options,
):
    """A client of server `role` ("ps" or "memory") at `address`, over TLS per the config's
    `security` section (servers with `tls_ca` ask for client certificates: ours is shown);
    reply bodies come through shared memory when `shared_memory` and the server is on this
    host (`easyrl.transport.shm`); `options`: `rpc.Client`'s keyword
    arguments."""
    tls = dict(tls_ca=sec.tls_ca, tls_cert=sec.tls_cert, tls_key=sec.tls_key)
    client = rpc.Client(rpc.stub_class(role), address, token, **tls, **options)
    prefix = shm.run_prefix(token) if shared_memory and shm.same_host(address) else None
    return ParameterClient(client, prefix) if role == "ps" else MemoryClient(client, prefix)
