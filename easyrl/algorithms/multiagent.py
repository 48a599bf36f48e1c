"""Multi-agent training: several policies of one algorithm, one per group of agents.

The config's `multiagent` section names the policies and maps the env's agent ids to them
(`policy_mapping`, and `default_policy` for the agents it leaves out; one policy for all
agents is a shared policy). Each policy is an ordinary agent of the configured algorithm
(`build` is called once per policy, with its own seed); `MultiAgent` wraps them so that the
runtime sees one agent of the algorithm's flow:

- variables: the union, each policy's named `{policy}/{name}`, so every policy has its own
  PS variables (and optimizer state);
- acting: the actor steps a `easyrl.envs.multiagent.SlotVectorEnv` (slot = env copy x
  agent); the collector keeps one collector of the policy's agent per slot (1 env each) and
  calls it only on steps where the slot's agent is present: an absent agent's timeline
  pauses (a recurrent policy's state too), and its departure was an episode end of its slot;
- replay: one stream, items tagged with an int64 `policy` column (the policy's index in
  `multiagent.policies`); the learner splits each batch by it. One table keeps the memory
  role, its rate limiter and the learner's prefetching unchanged; a policy's share of the
  learner's batches is its share of the data;
- learning: each policy's agent learns on its rows; the gradients are merged in the order of
  `variables`, None for a policy without rows in the batch (the PS leaves its variables
  alone: each policy has its own optimizer group, `optimizer`); stats are reported as
  `{policy}.{stat}`. Synchronous rounds (PPO) zip the policies' updates of the round.

Supported algorithms: those whose spec sets `multiagent` (async replay: DQN, IMPALA;
synchronous rounds: PPO). Greedy play (`easyrl rollout`, `easyrl export`, the evaluator)
refuses multi-agent runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from easyrl.algorithms.contract import (
    AlgorithmSpec,
    Batch,
    Collector,
    LearnStep,
    PrioritizedAgent,
    ReplayAgent,
    RoundCollector,
    RoundsAgent,
    concat,
)
from easyrl.errors import ConfigError, EasyRLError, did_you_mean
from easyrl.seeds import derive_seed

POLICY_COLUMN = "policy"
"""The replay column holding an item's policy index (int64)."""

_POLICY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")

NO_GREEDY = (
    "multi-agent runs have one policy per group of agents and no single greedy policy: "
    "easyrl rollout, easyrl export and the evaluator refuse them"
)


def check_config(cfg) -> None:
    """Checks a config's `multiagent` section against the other sections and the env's agents
    (it makes one env); the config checks first that the algorithm's spec sets `multiagent`.

    Raises:
        ConfigError: naming the key: a bad or unknown policy name (with the closest valid
            one), an agent without a policy or an unknown agent id (with the closest), a
            policy no agent uses, or a section that multi-agent runs do not support
            (evaluator, recording, datasets, non-sync vector envs, Atari).
    """
    ma = cfg.multiagent
    refused = {
        "cluster.evaluator": (cfg.cluster.evaluator != 0, "0 (" + NO_GREEDY + ")"),
        "output.dir": (cfg.output.dir is not None, "null (recording is single-agent)"),
        "input.dir": (cfg.input.dir is not None, "null (datasets are single-agent)"),
        "env.vector": (cfg.env.vector != "sync", "sync (the copies step in the actor)"),
        "env.atari": (cfg.env.atari is not None, "null"),
    }
    for key, (bad, valid) in refused.items():
        if bad:
            raise ConfigError(f"{key}: a multi-agent run (multiagent:) needs {key} {valid}")
    _check_policies(ma)
    from easyrl.envs.multiagent import agent_spaces

    agents, _, _ = agent_spaces(cfg.env.id, cfg.env.kwargs)
    mapping = policy_of_agents(ma, agents)  # every agent has a policy
    for key in ma.policy_mapping:
        if key not in agents:
            raise ConfigError(
                f"multiagent.policy_mapping: {cfg.env.id} has no agent {key!r}; "
                + did_you_mean(key, agents, f"its agents: {', '.join(agents)}")
            )
    unused = [p for p in ma.policies if p not in mapping]
    if unused:
        raise ConfigError(
            f"multiagent.policies: no agent is mapped to {', '.join(map(repr, unused))} "
            "(map one in multiagent.policy_mapping, or leave the policy out)"
        )


def _check_policies(ma) -> None:
    """Checks the policy names and the names the mapping and the default use."""
    for i, name in enumerate(ma.policies):
        if not _POLICY_NAME.fullmatch(name):
            raise ConfigError(
                f"multiagent.policies[{i}]: {name!r} is not a policy name (a letter or _, then "
                "up to 31 letters, digits or _)"
            )
    if len(set(ma.policies)) != len(ma.policies):
        raise ConfigError(f"multiagent.policies: names must be unique, got {list(ma.policies)}")
    named = [(f"multiagent.policy_mapping.{a}", p) for a, p in ma.policy_mapping.items()]
    if ma.default_policy is not None:
        named.append(("multiagent.default_policy", ma.default_policy))
    for key, policy in named:
        if policy not in ma.policies:
            raise ConfigError(
                f"{key}: unknown policy {policy!r}; "
                + did_you_mean(policy, ma.policies, f"policies: {', '.join(ma.policies)}")
            )


def policy_of_agents(ma, agents: list[str]) -> dict[str, list[str]]:
    """{policy: its agent ids} for the env's `agents` under section `ma`.

    Raises:
        ConfigError: an agent has no policy (neither mapped nor a `default_policy`).
    """
    out: dict[str, list[str]] = {}
    for agent in agents:
        policy = ma.policy_mapping.get(agent, ma.default_policy)
        if policy is None:
            raise ConfigError(
                f"multiagent.policy_mapping: agent {agent!r} has no policy; map it (e.g. "
                f"{agent}: {ma.policies[0]}) or set multiagent.default_policy"
            )
        out.setdefault(policy, []).append(agent)
    return out


def slot_policies(ma, agents: list[str]) -> np.ndarray:
    """The policy index `[A]` int64 of each of the env's `agents` (in their order)."""
    index = {p: i for i, p in enumerate(ma.policies)}
    by_policy = policy_of_agents(ma, agents)
    return np.array(
        [index[p] for a in agents for p, group in by_policy.items() if a in group], np.int64
    )


def replay_spec(spec: dict) -> dict:
    """An algorithm's replay columns plus the int64 `policy` column."""
    return {**spec, POLICY_COLUMN: ((), np.dtype(np.int64))}


def optimizer(cfg, algorithm: AlgorithmSpec) -> dict:
    """The PS optimizer of a multi-agent run: the algorithm's, once per policy (its group
    prefixes under `{policy}/`), so that a push with one policy's gradients (a batch without
    the other's rows) steps that policy's optimizer alone, with its own step counter."""
    from easyrl.algorithms.optimizers import OptimizerSpec

    spec = algorithm.optimizer(cfg.algorithm.params)
    specs = {"": spec} if isinstance(spec, OptimizerSpec) else dict(spec)
    return {f"{p}/{prefix}": s for p in cfg.multiagent.policies for prefix, s in specs.items()}


def build(
    cfg, algorithm: AlgorithmSpec, obs_space, action_space, learner: bool = False
) -> MultiAgent:
    """Builds one agent of `algorithm` per policy of `cfg.multiagent` (policy i with seed
    `derive_seed(run.seed, "policy", i)`) and wraps them (imports TensorFlow)."""
    from easyrl.envs.multiagent import agent_spaces

    ma = cfg.multiagent
    agents = [
        algorithm.make(
            cfg.algorithm.params,
            obs_space,
            action_space,
            cfg.model,
            derive_seed(cfg.run.seed, "policy", i),
            learner,
        )
        for i in range(len(ma.policies))
    ]
    agent_ids, _, _ = agent_spaces(cfg.env.id, cfg.env.kwargs)
    return MultiAgent(list(ma.policies), agents, slot_policies(ma, agent_ids), action_space)


class MultiAgent:
    """Several agents of one algorithm as one agent of its flow (see the module docstring).

    Args:
        names: the policy names, in `multiagent.policies` order.
        agents: one built agent per policy.
        agent_policy: the policy index `[A]` of each agent id of the env (slot j of a copy).
        action_space: the agents' action space (an absent slot's placeholder action).

    Raises:
        EasyRLError: the agents differ in flow, or `names` and `agents` differ in length.
    """

    def __init__(self, names: list[str], agents: list[Any], agent_policy: np.ndarray, action_space):
        if len(names) != len(agents) or not agents:
            raise EasyRLError(f"{len(names)} policy names for {len(agents)} agents")
        if len({a.flow for a in agents}) != 1:
            raise EasyRLError("the policies' agents must share one flow")
        self.names, self.agents = list(names), list(agents)
        self.agent_policy = np.asarray(agent_policy, np.int64)
        self.flow = agents[0].flow
        self.variables = {
            f"{name}/{key}": var
            for name, agent in zip(names, agents, strict=True)
            for key, var in agent.variables.items()
        }
        sizes = [len(a.variables) for a in agents]
        ends = list(itertools.accumulate(sizes))
        self._ranges = [range(end - size, end) for size, end in zip(sizes, ends, strict=True)]
        self._blank = np.zeros(action_space.shape, action_space.dtype)

    # --- the Agent protocol --------------------------------------------------------------

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Refused (see `NO_GREEDY`).

        Raises:
            EasyRLError: always.
        """
        raise EasyRLError(NO_GREEDY)

    @property
    def greedy_fn(self) -> Any:
        """Refused (see `NO_GREEDY`).

        Raises:
            EasyRLError: always.
        """
        raise EasyRLError(NO_GREEDY)

    def collector(
        self, num_envs: int, seed: int, actor_index: int, num_actors: int
    ) -> SlotCollector:
        """The collector of `num_envs` env copies (`num_envs * A` slots): one collector of
        the slot's policy per slot (seed `derive_seed(seed, "slot", s)`), for rounds a
        `SlotRoundCollector`."""
        slots = np.tile(self.agent_policy, num_envs)  # [S] policy of each slot
        subs = [
            self.agents[p].collector(1, derive_seed(seed, "slot", s), actor_index, num_actors)
            for s, p in enumerate(slots.tolist())
        ]
        kind = SlotRoundCollector if self.flow == "sync_rounds" else SlotCollector
        return kind(subs, slots, self.names, self._blank)

    # --- learning ------------------------------------------------------------------------

    def _split(self, batch: Batch) -> Iterator[tuple[int, np.ndarray, Batch]]:
        """(policy index, its rows, its rows' columns without `policy`) per policy with
        rows in `batch`."""
        if POLICY_COLUMN not in batch:
            raise EasyRLError(f"a multi-agent batch needs a {POLICY_COLUMN!r} column")
        policy = np.asarray(batch[POLICY_COLUMN]).reshape(-1)
        for i in range(len(self.agents)):
            rows = np.flatnonzero(policy == i)
            if rows.size:
                yield i, rows, {k: v[rows] for k, v in batch.items() if k != POLICY_COLUMN}

    def _merge(self, parts: list[tuple[int, LearnStep]]) -> tuple[list, dict[str, float]]:
        """The policies' steps as gradients over `variables` (None where a policy has no
        step) and their stats, `{policy}.{stat}`."""
        grads: list[np.ndarray | None] = [None] * len(self.variables)
        stats: dict[str, float] = {}
        for i, step in parts:
            grads[self._ranges[i].start : self._ranges[i].stop] = step.grads
            stats.update({f"{self.names[i]}.{k}": v for k, v in step.stats.items()})
        return grads, stats

    def learn(self, batch: Batch, weights: np.ndarray) -> LearnStep:
        """One gradient computation: each policy's agent on its rows (async replay).

        Returns:
            the merged LearnStep; priorities `[B]` in the batch's order when the policies
            compute them.
        """
        parts, priorities = [], None
        for i, rows, sub in self._split(batch):
            agent = cast(ReplayAgent, self.agents[i])
            step = agent.learn(sub, weights[rows])
            parts.append((i, step))
            if step.priorities is not None:
                if priorities is None:
                    priorities = np.zeros(len(batch[POLICY_COLUMN]), np.float64)
                priorities[rows] = step.priorities
        grads, stats = self._merge(parts)
        return LearnStep(grads, stats, priorities)

    def initial_priorities(self, batch: Batch) -> np.ndarray:
        """Each policy's initial priorities of its rows `[B]` (prioritized replay)."""
        out = np.zeros(len(batch[POLICY_COLUMN]), np.float64)
        for i, rows, sub in self._split(batch):
            out[rows] = cast(PrioritizedAgent, self.agents[i]).initial_priorities(sub)
        return out

    @property
    def target_update_period(self) -> int:
        """The policies' period of target syncs (one algorithm: the same for all)."""
        return cast(ReplayAgent, self.agents[0]).target_update_period

    def sync_target(self) -> None:
        """Syncs every policy's target networks."""
        for agent in self.agents:
            cast(ReplayAgent, agent).sync_target()

    def learn_round(self, batch: Batch, rng: np.random.Generator) -> Iterator[LearnStep]:
        """The round's updates (synchronous rounds): step k updates every policy that still
        has a k-th update of its own round on its rows."""
        rounds = {
            i: cast(RoundsAgent, self.agents[i]).learn_round(sub, rng)
            for i, _, sub in self._split(batch)
        }
        while rounds:
            parts = []
            for i, steps in list(rounds.items()):
                step = next(steps, None)
                if step is None:
                    del rounds[i]
                else:
                    parts.append((i, step))
            if parts:
                yield LearnStep(*self._merge(parts))

    def end_round(self, batch: Batch) -> list[str]:
        """Each policy's end of round on its rows; the changed variables' names."""
        changed = []
        for i, _, sub in self._split(batch):
            names = cast(RoundsAgent, self.agents[i]).end_round(sub)
            changed += [f"{self.names[i]}/{name}" for name in names]
        return changed


class SlotCollector:
    """Collects for a `SlotVectorEnv`'s S slots with one 1-env collector per slot.

    Before each `act` the actor sets `present` `[S]` bool (`SlotVectorEnv.present`): only
    present slots' collectors act and observe that step; an absent slot gets a placeholder
    action (the env ignores it). Items come back tagged with their slot's policy index.

    Args:
        subs: the slots' collectors (1 env each).
        slot_policy: the policy index `[S]` of each slot.
        names: the policy names.
        blank: the placeholder action.
    """

    def __init__(
        self, subs: list[Collector], slot_policy: np.ndarray, names: list[str], blank: np.ndarray
    ):
        self.subs = subs
        self.slot_policy = slot_policy
        self.names = names
        self.present = np.ones(len(subs), bool)
        """Which slots act on the next `act`'s observations (set by the actor)."""
        self.last_action_logp: np.ndarray | None = None
        self._blank = blank
        self._acted: np.ndarray | None = None

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions `[S, ...]`: each present slot's collector's, the placeholder elsewhere.

        Raises:
            EasyRLError: `act` was already called for this step.
        """
        if self._acted is not None:
            raise EasyRLError("act called twice without observe")
        self._acted = self.present.copy()
        actions = np.repeat(self._blank[None], len(self.subs), axis=0)  # [S, ...]
        for s in np.flatnonzero(self._acted):
            actions[s] = self.subs[s].act(obs[s : s + 1], rng)[0]
        return actions

    def _observe_slots(self, rewards, next_obs, real_next_obs, terminated, truncated):
        """Hands each slot that acted its row; yields (slot, items it completed)."""
        if self._acted is None:
            raise EasyRLError("observe called without a preceding act")
        acted, self._acted = self._acted, None
        for s in np.flatnonzero(acted):
            rows = slice(s, s + 1)
            out = self.subs[s].observe(
                rewards[rows],
                next_obs[rows],
                real_next_obs[rows],
                terminated[rows],
                truncated[rows],
            )
            if out is not None:
                n = len(next(iter(out.values())))
                yield s, {**out, POLICY_COLUMN: np.full(n, self.slot_policy[s], np.int64)}

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> Batch | None:
        """The step's outcome for the slots that acted; the items they completed (with their
        `policy` column), or None."""
        parts = [
            out
            for _, out in self._observe_slots(
                rewards, next_obs, real_next_obs, terminated, truncated
            )
        ]
        return concat(parts) if parts else None

    def stats(self) -> dict[str, float]:
        """Each acting stat as `{policy}.{stat}`, the mean over the policy's slots."""
        sums: dict[str, list[float]] = {}
        for s, sub in enumerate(self.subs):
            for key, value in sub.stats().items():
                sums.setdefault(f"{self.names[self.slot_policy[s]]}.{key}", []).append(value)
        return {k: float(np.mean(v)) for k, v in sums.items()}


class SlotRoundCollector(SlotCollector):
    """A `SlotCollector` of synchronous rounds: each slot contributes its collector's first
    round batch (an equal share of the round), and the round is complete when every slot has
    one. A slot that has its share keeps acting, unrecorded, while the others catch up
    (absent agents delay a round, never end it short); its collector's next batch starts
    afresh with the next round (each round bootstraps at its end). So every agent must keep
    coming back: one an env never brings back stalls the round."""

    resets_envs = False
    """Episodes continue across rounds."""

    def __init__(
        self, subs: list[Collector], slot_policy: np.ndarray, names: list[str], blank: np.ndarray
    ):
        super().__init__(subs, slot_policy, names, blank)
        self._parts: list[Batch | None] = [None] * len(subs)

    def start_round(self, share: int) -> None:
        """Starts a round of `share` items, `share / S` per slot.

        Raises:
            EasyRLError: `share` is not a multiple of the slots.
        """
        if share % len(self.subs):
            raise EasyRLError(f"a round share of {share} items over {len(self.subs)} slots")
        for sub in self.subs:
            cast(RoundCollector, sub).start_round(share // len(self.subs))
        self._parts = [None] * len(self.subs)
        self._acted = None

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> Batch | None:
        """Keeps each slot's first batch of the round; returns the whole round (slot order)
        once every slot has one, else None."""
        for s, out in self._observe_slots(rewards, next_obs, real_next_obs, terminated, truncated):
            if self._parts[s] is None:
                self._parts[s] = out
        if any(part is None for part in self._parts):
            return None
        return concat(cast(list[Batch], self._parts))
