"""The contract between the runtime and an algorithm, as types.

An algorithm is a module that declares itself once, `SPEC = AlgorithmSpec(...)` (its flow,
replay kinds, `Params`, capabilities and functions); the spec's `build` returns an agent.
The agent's `flow` says which loops the actor and learner run, and so which of the agent
protocols below it follows:

    flow              agent protocol    its collector      the learner calls
    async_replay      ReplayAgent       Collector          learn(batch, weights) -> LearnStep
                      ReplayLearner     (offline only: no collector)
                      PrioritizedAgent  (prioritized replay: also initial_priorities)
                      FusingLearner     (the spec's fused_update: also fuse_update)
    sync_rounds       RoundsAgent       RoundCollector     learn_round(batch, rng) -> LearnSteps
    actor_gradients   GradientsAgent    Collector          (the actor) learn(unroll, None)

Built with `model.lstm`, an agent is also a `RecurrentAgent`; with the spec's `action_logp`,
a `LogpAgent`.

Every gradient computation returns a `LearnStep`: gradients in the order of
`agent.variables` (what every PS shard is pushed), scalar stats (reported to PS shard 0),
and, for prioritized replay, the batch's new priorities. Nothing here imports TensorFlow:
loading a config stays cheap.
"""

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from easyrl.errors import ConfigError
from easyrl.replay import kinds as replay_kinds
from easyrl.replay.sampled import Batch

Flow = Literal["async_replay", "sync_rounds", "actor_gradients"]
"""The loop an algorithm's actor and learner run."""
FLOWS: tuple[Flow, ...] = ("async_replay", "sync_rounds", "actor_gradients")

ReplayKind = str
"""The name of a replay kind an algorithm's items can go to: one registered in
`easyrl.replay.kinds` (built in: uniform, prioritized, trajectory, aggregate)."""

ReplaySpec = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Replay columns: {name: (per-item shape, numpy dtype)}."""


class LearnStep(NamedTuple):
    """What one gradient computation hands the runtime.

    Attributes:
        grads: the loss's gradients, one array per variable, in the order of `variables`;
            None for a variable this step leaves alone (TD3's actor between its updates). A
            step that computes them as one flat tensor hands it over as a `FlatGradients`
            (`easyrl.models.flat`): a learner applying its own updates uses the tensor
            without a copy to numpy.
        stats: scalar diagnostics (loss terms, means), reported to PS shard 0.
        priorities: new replay priorities `[B]` of the batch's items (|TD| for DQN), or None
            when the algorithm computes none.
    """

    grads: Sequence[np.ndarray | None]
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


class FusingLearner(ReplayLearner, Protocol):
    """A replay learner whose compiled step can apply its update too, as its spec's
    `fused_update` says (DQN, BCQ, IMPALA, SAC, R2D2, MARWIL/BC: `models.flat.GradientStep`).
    A learner that applies its own updates (`easyrl.roles.publisher`) hands it its optimizer
    once, after its first `sync_target`; from then on `learn` returns gradients it applied
    already (a `FlatGradients` with `applied`), in one TensorFlow call per update. Without
    it, the learner's optimizer applies the gradients in a second call."""

    def fuse_update(self, optimizer: Any) -> bool:
        """Takes the update of `optimizer` (a `LocalOptimizer`: `optimizer.traced(absent)`)
        into the compiled step. Returns True when that step also steps the target networks
        after every update (the learner then no longer calls `sync_target`)."""
        ...


class ReplayAgent(ReplayLearner, Protocol):
    """An async replay agent that actors collect with (all but the offline-only ones)."""

    def collector(self, num_envs: int, seed: int, actor_index: int, num_actors: int) -> Collector:
        """The actor-side collector of actor `actor_index` of `num_actors`."""
        ...


class PrioritizedAgent(ReplayAgent, Protocol):
    """A replay agent whose spec's `replay_kinds` include "prioritized" (DQN, DDPG/TD3, SAC)."""

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


Recurrence = Literal["no", "optional", "only"]
"""Whether an algorithm's policy may carry a state: "no"; "optional": with `model.lstm` set,
its agents are `RecurrentAgent`s and its `replay_spec`/`round_share` take `lstm=`; "only":
`model.lstm` is required."""
RECURRENCES: tuple[Recurrence, ...] = ("no", "optional", "only")


class RecurrentAgent(Agent, Protocol):
    """An agent built with `model.lstm` (IMPALA, A3C, PPO, R2D2): its policy carries a state
    per env, zeros at an episode's start, so greedy play steps it (`greedy` refuses)."""

    @property
    def state_size(self) -> int:
        """Floats in one env's state (> 0)."""
        ...

    def greedy_step(
        self, obs: np.ndarray, state: np.ndarray, first: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(deterministic actions `[N]`, next state `[N, state_size]`) for observations
        `[N, ...]`, the state, and the episode-start flags `first` `[N]` (1: start from
        zeros)."""
        ...


class LogpAgent(Agent, Protocol):
    """An agent whose spec sets `action_logp` (MARWIL, BC): off-policy evaluation weighs a
    dataset's episodes with its policy's probabilities."""

    def action_logp(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a | s) `[N]` of `actions` `[N, ...]` at observations `[N, ...]`."""
        ...


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm, as the runtime knows it: each algorithm module declares one,
    `SPEC = AlgorithmSpec(...)`, and config load, the registry, the roles, multi-agent runs and
    off-policy evaluation read it and nothing else of the module.

    Raises:
        ConfigError: the fields do not fit together (an unknown flow or replay kind, a missing
            `replay_spec` or `round_share`, a `Params` without the `RuntimeParams`, ...).
    """

    flow: Flow
    """Which loops the actor and learner run (see the module docstring)."""
    replay_kinds: tuple[ReplayKind, ...]
    """The replay table kinds its items can go to, the default first; () for no replay."""
    params_class: type
    """A frozen dataclass of hyper-parameters (the config's `algorithm` keys; a
    `RuntimeParams`, and a `ReplayParams` when learners sample batches)."""
    build: Callable[..., Agent]
    """`build(params, obs_space, action_space, model, seed=0, learner=False)`: the TF side
    (imports TensorFlow), an agent of `flow`'s protocol."""
    optimizer: Callable[[Any], Any]
    """`optimizer(params)`: the PS optimizer, an `OptimizerSpec` or {variable prefix: spec}."""
    replay_spec: Callable[..., ReplaySpec]
    """`replay_spec(params, obs_space, action_space[, lstm=])`: the columns of one item (what
    an actor collects, even with no replay table: A3C's unrolls)."""
    round_share: Callable[..., int] | None = None
    """sync_rounds only (required there): `round_share(params, num_envs, actor_index,
    num_actors[, lstm=])`, the items one actor ships per round."""
    dataset_items: Callable[[Any, Batch], Batch] | None = None
    """async_replay only: `dataset_items(params, steps)`, the replay items of a recorded
    dataset's rows (`easyrl.offline.dataset.read_steps`); None: it cannot train offline."""
    model_kinds: tuple[str, ...] = ("mlp",)
    """The `model.kind`s it builds its networks from ("custom": a `module:Class` torso), and
    "encoders" where its networks pass `observation_parts` on (`model.encoders` works)."""
    recurrence: Recurrence = "no"
    """Whether `model.lstm` works ("optional"), is refused ("no") or required ("only")."""
    action_masks: bool = False
    """Its agents honour an observation's action mask (`easyrl.envs.flat`)."""
    multiagent: bool = False
    """It trains multi-agent runs (`easyrl.algorithms.multiagent`)."""
    offline_only: bool = False
    """It trains from a dataset only (`input.dir` required; no collector); needs
    `dataset_items`."""
    action_logp: bool = False
    """Its agents are `LogpAgent`s: the evaluator estimates their value on an offline run's
    dataset (importance sampling)."""
    fused_update: bool = False
    """Its agents are `FusingLearner`s: a learner that applies its own updates traces its
    optimizer step into the agent's compiled step (`fuse_update`), one call per update."""

    def __post_init__(self):
        problem = next(self._problems(), None)
        if problem is not None:
            raise ConfigError(f"AlgorithmSpec: {problem}")

    def make(
        self, params, obs_space, action_space, model, seed: int = 0, learner: bool = False
    ) -> Agent:
        """`build`s the agent (every role, `easyrl.load`, `rollout` and `export` reach an
        algorithm this way) and checks that it runs the spec's flow: the config sized the
        cluster from the spec's, the roles pick their loops from the agent's.

        Raises:
            ConfigError: the agent's `flow` is not the spec's, or it lacks the `fuse_update`
                the spec's `fused_update` promises.
        """
        agent = self.build(params, obs_space, action_space, model, seed, learner)
        if getattr(agent, "flow", None) != self.flow:
            raise ConfigError(
                f"{type(agent).__name__}.flow is {getattr(agent, 'flow', None)!r}, but its "
                f"AlgorithmSpec says {self.flow!r}: the roles would run loops the cluster "
                "was not sized for"
            )
        if self.fused_update and not callable(getattr(agent, "fuse_update", None)):
            raise ConfigError(
                f"{type(agent).__name__} has no fuse_update, but its AlgorithmSpec says "
                "fused_update (see easyrl.algorithms.contract.FusingLearner)"
            )
        return agent

    def _problems(self) -> Iterator[str]:
        """What does not fit together, one sentence each."""
        if self.flow not in FLOWS:
            yield f"flow {self.flow!r} is not one of {', '.join(FLOWS)}"
        found: list[replay_kinds.Kind] = []
        for name in self.replay_kinds:
            try:
                found.append(replay_kinds.get(name, "replay_kinds"))
            except ConfigError as err:
                yield str(err)
        if len(set(self.replay_kinds)) != len(self.replay_kinds):
            yield f"replay_kinds {self.replay_kinds!r}: each kind once"
        if (self.flow == "sync_rounds") != (self.round_share is not None):
            yield "round_share is required with flow sync_rounds, and only there"
        if self.dataset_items is not None and self.flow != "async_replay":
            yield "dataset_items needs flow async_replay (a learner sampling the dataset)"
        if self.fused_update and self.flow != "async_replay":
            yield "fused_update needs flow async_replay (a learner applying its own updates)"
        if self.offline_only and self.dataset_items is None:
            yield "offline_only needs dataset_items (what the memory shards load)"
        if self.recurrence not in RECURRENCES:
            yield f"recurrence {self.recurrence!r} is not one of {', '.join(RECURRENCES)}"
        if not dataclasses.is_dataclass(self.params_class):
            yield f"params_class {self.params_class!r} must be a dataclass"
            return
        runtime = ["max_staleness"]
        if any(kind.batches for kind in found):
            runtime.append("batch_size")  # learners sample batches of this size
        fields = {f.name for f in dataclasses.fields(self.params_class)}
        # A field, or a property / class constant (LinUCB's fixed max_staleness).
        lacking = [n for n in runtime if n not in fields and not hasattr(self.params_class, n)]
        if lacking:
            yield (
                f"{self.params_class.__name__} lacks {', '.join(lacking)}, which the runtime "
                "reads (see easyrl.algorithms.contract.RuntimeParams)"
            )


def concat(parts: Sequence[Batch], keys: Iterable[str] | None = None) -> Batch:
    """The columns `keys` (default: those of the first part) of `parts`, each concatenated
    along the first axis."""
    return {k: np.concatenate([p[k] for p in parts]) for k in (parts[0] if keys is None else keys)}
