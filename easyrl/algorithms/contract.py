"""The contract between the runtime and an algorithm, as types.

An algorithm is a module (see `AlgorithmModule`) whose `build` returns an agent. The agent's
`flow` says which loops the actor and learner run, and so which of the agent protocols below
it follows:

    flow              agent protocol    its collector      the learner calls
    async_replay      ReplayAgent       Collector          learn(batch, weights) -> LearnStep
                      ReplayLearner     (offline only: no collector)
                      PrioritizedAgent  (prioritized replay: also initial_priorities)
    sync_rounds       RoundsAgent       RoundCollector     learn_round(batch, rng) -> LearnSteps
    actor_gradients   GradientsAgent    Collector          (the actor) learn(unroll, None)

Every gradient computation returns a `LearnStep`: gradients in the order of
`agent.variables` (what every PS shard is pushed), scalar stats (reported to PS shard 0),
and, for prioritized replay, the batch's new priorities. Nothing here imports TensorFlow:
loading a config stays cheap.
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

Flow = Literal["async_replay", "sync_rounds", "actor_gradients"]
"""The loop an algorithm's actor and learner run."""
FLOWS: tuple[Flow, ...] = ("async_replay", "sync_rounds", "actor_gradients")

ReplayKind = Literal["uniform", "prioritized", "trajectory", "aggregate"]
"""The replay tables an algorithm's items can go to."""
REPLAY_KINDS: tuple[ReplayKind, ...] = ("uniform", "prioritized", "trajectory", "aggregate")

Batch = dict[str, np.ndarray]
"""Named columns, batch-major: the items of a replay table, or what a collector ships."""
ReplaySpec = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Replay columns: {name: (per-item shape, numpy dtype)}."""


class LearnStep(NamedTuple):
    """What one gradient computation hands the runtime.

    Attributes:
        grads: the loss's gradients, one array per variable, in the order of `variables`;
            None for a variable this step leaves alone (TD3's actor between its updates).
        stats: scalar diagnostics (loss terms, means), reported to PS shard 0.
        priorities: new replay priorities `[B]` of the batch's items (|TD| for DQN), or None
            when the algorithm computes none.
    """

    grads: list[np.ndarray | None]
    stats: dict[str, float]
    priorities: np.ndarray | None = None


class RuntimeParams(Protocol):
    """The hyper-parameters the runtime reads, beside the algorithm's own; every `Params`
    has them (checked when the registry loads the module)."""

    @property
    def max_staleness(self) -> int:
        """PS shards drop gradients computed against a version older than this many
        updates."""
        ...


class ReplayParams(RuntimeParams, Protocol):
    """Hyper-parameters of an algorithm whose learners sample batches (uniform, prioritized
    and trajectory tables)."""

    @property
    def batch_size(self) -> int:
        """Items per sampled batch."""
        ...


class Collector(Protocol):
    """An actor's side of an algorithm, per vector step of `num_envs` envs: `act`, step the
    envs, `observe`."""

    last_action_logp: np.ndarray | None
    """Log-probabilities `[N]` of the last `act`'s actions under the behaviour policy (what
    an offline dataset records), or None where the policy has none."""

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions `[N, ...]` for observations `[N, ...]`."""
        ...

    def observe(
        self,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        real_next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> Batch | None:
        """Takes the step's outcome (`real_next_obs`: the final observation where an episode
        ended, `next_obs`: what the next `act` sees); returns the items completed by it."""
        ...

    def stats(self) -> dict[str, float]:
        """Scalar diagnostics of acting (exploration rate, ...), reported with env steps."""
        ...


class RoundCollector(Collector, Protocol):
    """A collector of synchronous rounds: `observe` returns the actor's whole share of the
    round once it is complete."""

    resets_envs: bool
    """Whether every round starts from fresh episodes (ES) or continues them (PPO)."""

    def start_round(self, share: int) -> None:
        """Starts collecting `share` items with the round's weights."""
        ...


class Agent(Protocol):
    """What `build` returns, whatever the flow: variables and the greedy policy."""

    @property
    def flow(self) -> Flow:
        """The flow of this agent (one module may build agents of several, as IMPALA/A3C)."""
        ...

    @property
    def variables(self) -> Mapping[str, Any]:
        """{name: tf.Variable}: the names every process agrees on, in gradient order."""
        ...

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for a batch of observations (evaluation, rollout)."""
        ...

    @property
    def greedy_fn(self) -> Any:
        """The compiled function `greedy` calls, with a fixed input signature;
        `easyrl export` saves it as a SavedModel."""
        ...


class ReplayLearner(Agent, Protocol):
    """The learner's side of the async replay flow (DQN, IMPALA, DDPG/TD3, SAC, and the
    offline learners BC, MARWIL, BCQ)."""

    @property
    def target_update_period(self) -> int:
        """Learner updates between target-network syncs; 0: no target network."""
        ...

    def learn(self, batch: Batch, weights: np.ndarray) -> LearnStep:
        """One gradient computation on a sampled batch with importance weights `[B]`."""
        ...

    def sync_target(self) -> None:
        """Copies the online networks into the target networks (nothing without one)."""
        ...


class ReplayAgent(ReplayLearner, Protocol):
    """An async replay agent that actors collect with (all but the offline-only ones)."""

    def collector(self, num_envs: int, seed: int, actor_index: int, num_actors: int) -> Collector:
        """The actor-side collector of actor `actor_index` of `num_actors`."""
        ...


class PrioritizedAgent(ReplayAgent, Protocol):
    """A replay agent whose REPLAY_KINDS include "prioritized" (DQN, DDPG/TD3, SAC)."""

    def initial_priorities(self, batch: Batch) -> np.ndarray:
        """Priorities `[B]` of freshly collected items, computed on the actor with its copy
        of the networks (Ape-X), so new data needs no max-priority guess."""
        ...


class RoundsAgent(Agent, Protocol):
    """An agent of the synchronous rounds flow (PPO, ES)."""

    def collector(
        self, num_envs: int, seed: int, actor_index: int, num_actors: int
    ) -> RoundCollector:
        """The actor-side round collector."""
        ...

    def learn_round(self, batch: Batch, rng: np.random.Generator) -> Iterator[LearnStep]:
        """The round's gradient computations; between two, the runtime assigns the new
        values to `variables`."""
        ...

    def end_round(self, batch: Batch) -> list[str]:
        """After the round's updates: names of variables changed outside the gradients
        (running observation statistics), which the runtime assigns on the PS."""
        ...


class GradientsAgent(Agent, Protocol):
    """An agent of the actor gradients flow (A3C): actors compute gradients themselves."""

    def collector(self, num_envs: int, seed: int, actor_index: int, num_actors: int) -> Collector:
        """The actor-side collector; its items are whole unrolls to learn from."""
        ...

    def learn(self, batch: Batch, weights: np.ndarray | None) -> LearnStep:
        """The gradients of one collected unroll."""
        ...


class AlgorithmModule(Protocol):
    """What an algorithm module exposes (`easyrl.algorithms.registry.module` checks it).

    Besides these, a module may define `MODEL_KINDS` (default ("mlp",); "encoders": its
    networks pass `observation_parts` on to `build_torso`, so `model.encoders` works),
    `RECURRENT` (True: `model.lstm` works, and `replay_spec`/`round_share` take `lstm=`;
    "only": it is required; default False), `OFFLINE_ONLY` (default False), `ACTION_MASKS`
    (default False: True when its agents honour an observation's action mask,
    `easyrl.envs.flat`), `round_share` (sync_rounds only: the items one actor ships per round)
    and `dataset_items` (async_replay only: replay items from a recorded dataset's rows).
    """

    FLOW: Flow
    REPLAY_KINDS: tuple[ReplayKind, ...]
    """The replay table kinds it works with, the default first; () for no replay memory."""
    Params: type
    """A frozen dataclass of hyper-parameters (a `RuntimeParams`)."""

    def optimizer(self, params: Any) -> Any:
        """The PS optimizer: an `OptimizerSpec`, or {variable prefix: spec}."""
        ...

    def replay_spec(self, params: Any, obs_space: Any, action_space: Any) -> ReplaySpec:
        """The replay columns of one item."""
        ...

    def build(
        self,
        params: Any,
        obs_space: Any,
        action_space: Any,
        model: Any,
        seed: int = 0,
        learner: bool = False,
    ) -> Agent:
        """The TF side (imports TensorFlow)."""
        ...


def concat(parts: Sequence[Batch], keys: Iterable[str] | None = None) -> Batch:
    """The columns `keys` (default: those of the first part) of `parts`, each concatenated
    along the first axis."""
    return {k: np.concatenate([p[k] for p in parts]) for k in (parts[0] if keys is None else keys)}
