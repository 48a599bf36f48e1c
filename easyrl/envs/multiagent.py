"""Multi-agent environments: the parallel API, a built-in cooperative env, and the slots
adapter the actor steps.

A multi-agent env follows PettingZoo's parallel API (`pettingzoo.ParallelEnv`): attributes
`possible_agents` (every agent id that can ever act) and `agents` (the ids acting now),
methods `observation_space(agent)`, `action_space(agent)`, `reset(seed=None) -> (obs,
infos)` and `step(actions) -> (obs, rewards, terminations, truncations, infos)`, all dicts
keyed by agent id. An agent that terminates or is truncated leaves `agents`; one may join
later in the same episode (it then appears in `agents` and in the observations); the env's
episode is over when `agents` is empty.

`env.id` names a multi-agent env either as a built-in id (`MULTIAGENT_ENVS`: pure numpy, no
PettingZoo needed) or as `package.module:factory`, a callable returning a parallel env
(e.g. `pettingzoo.classic.rps_v2:parallel_env`; easyrl[multiagent] installs PettingZoo).

`SlotVectorEnv` presents `num_envs` copies to the actor as a fixed vector of slots, slot
`e * len(possible_agents) + j` = agent j of copy e, with same-step autoreset conventions of
`easyrl.envs` (`infos["final_obs"]`): see its docstring for absent agents.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from easyrl.errors import ConfigError, EasyRLError, did_you_mean
from easyrl.imports import load_object


class TwoRunners:
    """A cooperative two-agent race on a line (parallel API, pure numpy).

    Agents `runner_0` and `runner_1` walk on cells 0..size-1, each towards its own goal cell
    (start and goal random, apart). Actions: 0 = left, 1 = stay, 2 = right for `runner_0`;
    `runner_1` is mirrored (0 = right, 2 = left), so one shared policy without an agent id
    cannot serve both: independent policies can. `runner_1` joins late, after `join_step`
    steps (or as soon as `runner_0` leaves, if that is earlier); an agent that reaches its
    goal leaves the episode early (terminated). The episode ends when both are done, or
    truncates every agent still running at `max_steps`.

    Team reward (the same for every agent present on a step):
        r_t = (agents reaching their goal on step t) - step_cost
    Observation of an agent (float32 `[3]`): its position / size, its goal / size and
    (goal - position) / size.

    Args:
        size: cells of the line (>= 3).
        join_step: env steps before `runner_1` appears (>= 0).
        max_steps: env steps before the episode is truncated (> join_step).
        step_cost: team penalty per step.

    Raises:
        ConfigError: an argument out of range (`env.kwargs`).
    """

    metadata: dict[str, Any] = {"name": "two_runners_v0"}
    possible_agents = ["runner_0", "runner_1"]
    render_mode = None

    def __init__(
        self, size: int = 8, join_step: int = 3, max_steps: int = 30, step_cost: float = 0.05
    ):
        if size < 3 or join_step < 0 or max_steps <= join_step:
            raise ConfigError(
                "env.kwargs: TwoRunners needs size >= 3, join_step >= 0 and max_steps > "
                f"join_step, got size {size}, join_step {join_step}, max_steps {max_steps}"
            )
        self.size, self.join_step, self.max_steps = size, join_step, max_steps
        self.step_cost = float(step_cost)
        self.agents: list[str] = []
        self._space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self._actions = gymnasium.spaces.Discrete(3)
        self._rng = np.random.default_rng()
        self._pos = np.zeros(2, np.int64)
        self._goal = np.zeros(2, np.int64)
        self._done = np.zeros(2, bool)
        self._t = 0

    @property
    def unwrapped(self) -> TwoRunners:
        """The env itself (no wrappers), as PettingZoo's API has it."""
        return self

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        """The observation space of `agent` (the same for both)."""
        return self._space

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete:
        """The action space of `agent` (the same for both: 3 moves)."""
        return self._actions

    def reset(self, seed: int | None = None, options: dict | None = None):
        """Starts an episode with `runner_0` only; returns ({agent: obs}, {agent: {}})."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        for i in range(2):
            self._pos[i], self._goal[i] = self._rng.choice(self.size, 2, replace=False)
        self._done[:] = False
        self._t = 0
        self.agents = ["runner_0"] if self.join_step > 0 else list(self.possible_agents)
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]):
        """Moves the present agents; returns (obs, rewards, terminations, truncations, infos)
        for them, then lets `runner_1` join when its time has come."""
        acting = list(self.agents)
        reached = 0
        for agent in acting:
            i = int(agent[-1])
            move = int(actions[agent]) - 1
            self._pos[i] = np.clip(self._pos[i] + (move if i == 0 else -move), 0, self.size - 1)
            if self._pos[i] == self._goal[i]:
                self._done[i] = True
                reached += 1
        self._t += 1
        reward = reached - self.step_cost
        obs = self._observations()
        truncate = self._t >= self.max_steps
        rewards = {a: reward for a in acting}
        terminations = {a: bool(self._done[int(a[-1])]) for a in acting}
        truncations = {a: truncate and not terminations[a] for a in acting}
        self.agents = [a for a in acting if not (terminations[a] or truncations[a])]
        joins = self._t == self.join_step or (self._t < self.join_step and not self.agents)
        if joins and not truncate:  # late, or at once when runner_0 left before its time
            self.agents.append("runner_1")
            obs["runner_1"] = self._observe(1)
            rewards["runner_1"] = 0.0  # a joining agent gets entries, as PettingZoo's do
            terminations["runner_1"] = truncations["runner_1"] = False
        return obs, rewards, terminations, truncations, {a: {} for a in obs}

    def _observe(self, i: int) -> np.ndarray:
        pos, goal = self._pos[i], self._goal[i]
        return np.array([pos, goal, goal - pos], np.float32) / self.size

    def _observations(self) -> dict[str, np.ndarray]:
        return {a: self._observe(int(a[-1])) for a in self.agents}

    def close(self) -> None:
        """Nothing to release."""


MULTIAGENT_ENVS: dict[str, Callable[..., Any]] = {"easyrl/TwoRunners-v0": TwoRunners}
"""Built-in multi-agent env ids and their factories."""


def env_factory(env_id: str) -> Callable[..., Any]:
    """The factory of multi-agent env `env_id`: a built-in id or `package.module:factory`.

    Raises:
        ConfigError: `env_id` is neither (the message names the closest built-in id), its
            module cannot be imported (for PettingZoo's: which extra installs it), or it names
            no callable.
    """
    if env_id in MULTIAGENT_ENVS:
        return MULTIAGENT_ENVS[env_id]
    if ":" not in env_id:
        builtin = ", ".join(MULTIAGENT_ENVS)
        hint = did_you_mean(env_id, list(MULTIAGENT_ENVS), f"built-in: {builtin}")
        raise ConfigError(
            f"env.id: unknown multi-agent env {env_id!r}; {hint} (or package.module:factory, "
            "a callable returning a PettingZoo ParallelEnv)"
        )
    if env_id.startswith("pettingzoo") and importlib.util.find_spec("pettingzoo") is None:
        raise ConfigError(f"env.id: {env_id!r} needs PettingZoo: pip install 'easyrl[multiagent]'")
    factory = load_object(env_id, "env.id")
    if not callable(factory):
        raise ConfigError(f"env.id: {env_id!r} is not a callable returning a parallel env")
    return factory


def make_env(env_id: str, kwargs: dict | None = None):
    """One multi-agent env: `env_factory(env_id)(**kwargs)`.

    Raises:
        ConfigError: an unknown env (see `env_factory`), or `kwargs` the factory does not
            take.
    """
    factory = env_factory(env_id)
    try:
        return factory(**(kwargs or {}))
    except TypeError as err:
        raise ConfigError(f"env.kwargs: {env_id!r} does not take {kwargs}: {err}") from err


def agent_spaces(
    env_id: str, kwargs: dict | None = None, agent_id: bool = False
) -> tuple[list[str], Any, Any]:
    """(possible agent ids, observation space, action space) of multi-agent env `env_id`;
    with `agent_id`, the observations end with the agent's one-hot index (A entries of 0/1).

    Raises:
        ConfigError: the env cannot be made, its observations are not a Box (a flat one with
            `agent_id`), or its agents' spaces differ (all agents share one replay stream
            layout, so they must share spaces).
    """
    env = make_env(env_id, kwargs)
    try:
        agents = [str(a) for a in env.possible_agents]
        if not agents:
            raise ConfigError(f"env.id: {env_id!r} has no possible_agents")
        obs_space, action_space = env.observation_space(agents[0]), env.action_space(agents[0])
        if not isinstance(obs_space, gymnasium.spaces.Box):
            raise ConfigError(
                f"env.id: multi-agent training needs Box observations; {env_id!r} gives "
                f"{agents[0]!r} {obs_space}"
            )
        for agent in agents[1:]:
            if env.observation_space(agent) != obs_space or env.action_space(agent) != action_space:
                raise ConfigError(
                    f"env.id: the agents of {env_id!r} must share one observation and one "
                    f"action space; {agent!r} differs from {agents[0]!r}"
                )
        if agent_id:
            if len(obs_space.shape) != 1:
                raise ConfigError(
                    f"multiagent.agent_id needs flat observations; {env_id!r} gives shape "
                    f"{obs_space.shape}"
                )
            ids = np.ones(len(agents), obs_space.dtype)
            low = np.concatenate([obs_space.low, 0 * ids])
            obs_space = gymnasium.spaces.Box(low, np.concatenate([obs_space.high, ids]))
        return agents, obs_space, action_space
    finally:
        env.close()


class SlotVectorEnv:
    """`num_envs` copies of a parallel env as a vector of S = num_envs * len(possible_agents)
    slots, slot `e * A + j` = agent j of copy e.

    A slot is present while its agent is in its copy's `agents`; `present` `[S]` says which
    slots act on the observations the last `reset`/`step` returned. `step(actions [S])` hands
    the present slots' actions to their copies (an absent slot's action is ignored) and
    returns per slot: the next observation (zeros for an absent slot), the reward (0 for an
    absent one), terminated and truncated. A slot is done when its agent terminated or was
    truncated, or left its copy's `agents` otherwise: its last observation is in
    `infos["final_obs"]`, as for a same-step autoreset. A copy whose `agents` is empty is
    reset on the same step, and its agents present after the reset act next. An agent that
    joins later is simply absent until then; one that joins again after leaving starts a new
    episode of its slot.

    Args:
        env_id: a multi-agent env id (see `env_factory`).
        num_envs: copies, >= 1.
        kwargs: the env's constructor keyword arguments (`env.kwargs`).
        max_episode_steps: truncate every present agent of a copy after this many steps of
            the copy's episode (None: the env's own limit).
        agent_id: end every observation with its agent's one-hot index (`agent_spaces`).

    Raises:
        ConfigError: an unknown env, or agents with differing spaces.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        kwargs: dict | None = None,
        max_episode_steps: int | None = None,
        agent_id: bool = False,
    ):
        if num_envs < 1:
            raise ConfigError(f"env.num_envs must be >= 1, got {num_envs}")
        self.agents, self.single_observation_space, self.single_action_space = agent_spaces(
            env_id, kwargs, agent_id
        )
        self.copies = [make_env(env_id, kwargs) for _ in range(num_envs)]
        self.max_episode_steps = max_episode_steps
        a = len(self.agents)
        self.num_envs = num_envs * a
        """S: the slots."""
        self.present = np.zeros(self.num_envs, bool)
        self._index = {agent: j for j, agent in enumerate(self.agents)}
        self._obs_shape = tuple(self.single_observation_space.shape or ())
        self._obs_dtype = self.single_observation_space.dtype
        # The agents' one-hot indexes, the last entries of each slot's observation ([S, A]).
        ids = np.tile(np.eye(a, dtype=self._obs_dtype), (num_envs, 1))
        self._ids = ids if agent_id else ids[:, :0]
        self._env_width = int(np.prod(self._obs_shape)) - self._ids.shape[1]  # the env's entries
        self._steps = np.zeros(num_envs, np.int64)
        self._seed: int | None = None

    def _slot(self, e: int, agent: Any) -> int:
        if agent not in self._index:
            raise EasyRLError(f"multi-agent env returned agent {agent!r} not in possible_agents")
        return e * len(self.agents) + self._index[agent]

    def _blank_obs(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, *self._obs_shape), self._obs_dtype)
        if self._ids.size:
            obs[:, self._env_width :] = self._ids
        return obs

    def _with_id(self, s: int, obs) -> np.ndarray:
        """Slot `s`'s observation: its agent's `obs`, then its one-hot index if asked."""
        if not self._ids.size:
            return obs
        return np.concatenate([np.asarray(obs, self._obs_dtype).reshape(-1), self._ids[s]])

    def _reset_copy(self, e: int, obs: np.ndarray, seed: int | None) -> None:
        """Resets copy `e`; writes its agents' observations into `obs`, marks them present."""
        first, _ = self.copies[e].reset(seed=seed)
        self._steps[e] = 0
        for agent in self.copies[e].agents:
            s = self._slot(e, agent)
            obs[s], self.present[s] = self._with_id(s, first[agent]), True

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """Resets every copy (copy e with `seed + e`); returns (obs `[S, ...]`, {})."""
        obs = self._blank_obs()
        self.present[:] = False
        for e in range(len(self.copies)):
            self._reset_copy(e, obs, None if seed is None else seed + e)
        return obs, {}

    def step(self, actions: np.ndarray):
        """Steps every copy with its present slots' actions (see the class docstring).

        Returns:
            (obs `[S, ...]`, rewards `[S]` float32, terminated `[S]`, truncated `[S]`, infos
            with `final_obs` (object `[S]`) and `_final_obs` (`[S]` bool) for done slots).
        """
        a = len(self.agents)
        obs = self._blank_obs()
        rewards = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        final = np.full(self.num_envs, None, object)
        acted = self.present.copy()
        self.present[:] = False
        for e, env in enumerate(self.copies):
            moves = {ag: actions[e * a + j] for j, ag in enumerate(self.agents) if acted[e * a + j]}
            nxt, rew, term, trunc, _ = env.step(moves)
            self._steps[e] += 1
            limit = self.max_episode_steps is not None and self._steps[e] >= self.max_episode_steps
            left = {ag for ag in moves if term.get(ag, False) or trunc.get(ag, False)}
            staying = set() if limit else set(env.agents) - left
            for agent in moves:
                s = self._slot(e, agent)
                rewards[s] = rew.get(agent, 0.0)
                terminated[s] = bool(term.get(agent, False))
                truncated[s] = not terminated[s] and (bool(trunc.get(agent, False)) or limit)
                if agent not in staying:  # gone: a slot episode end, whatever the env said
                    truncated[s] |= not terminated[s]
                    # an agent gone without an observation ends on a blank one
                    final[s] = (
                        self._with_id(s, nxt[agent]) if agent in nxt else self._blank_obs()[s]
                    )
            for agent in staying:
                s = self._slot(e, agent)
                obs[s], self.present[s] = self._with_id(s, nxt[agent]), True
            if not staying:
                self._reset_copy(e, obs, None)
        done = terminated | truncated
        return obs, rewards, terminated, truncated, {"final_obs": final, "_final_obs": done}

    def close(self) -> None:
        """Closes every copy."""
        for env in self.copies:
            env.close()


def run_spaces(cfg) -> tuple[Any, Any]:
    """(observation space, action space) of one agent of the env a config describes: the
    gymnasium env's, or the agents' shared spaces when `cfg.multiagent` is set."""
    if cfg.multiagent.enabled:
        ma = cfg.multiagent
        _, obs_space, action_space = agent_spaces(cfg.env.id, cfg.env.kwargs, ma.agent_id)
        return obs_space, action_space
    from easyrl.envs import env_options, env_spaces

    return env_spaces(cfg.env.id, **env_options(cfg.env))
