"""The config's schema: one frozen dataclass per section, every field typed with a default and
a one-line docstring, and the value rules each section checks when it is built (`_RULES`,
`_CROSS_RULES`). Nothing here knows an algorithm: checks that need one live in
`easyrl.config` (the loader's cross-section resolution)."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from easyrl.errors import ConfigError
from easyrl.replay import kinds as replay_kinds


class _Section:
    """Base of the config sections: validates the values after construction (see `_RULES`)."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class AtariConfig(_Section):
    """Atari preprocessing (ale-py envs such as ALE/Pong-v5; install easyrl[atari])."""

    SECTION: ClassVar[str] = "env.atari"

    noop_max: int = 30
    """Up to this many no-op actions after each reset (random start states)."""
    frame_skip: int = 4
    """Each action repeats this many frames; the observation is the max of the last two."""
    screen_size: int = 84
    """Frames are resized to screen_size x screen_size (84: Nature DQN; 42: EasyRL)."""
    grayscale: bool = True
    """Grey-scale frames (one channel per stacked frame)."""
    frame_stack: int = 4
    """Observations stack the last frame_stack frames as channels: [H, W, frame_stack]."""
    episodic_life: bool = True
    """A lost life ends the training episode but not the game, which goes on from where it
    was (DeepMind's EpisodicLifeEnv: only a game over starts a new game). Reported training
    returns are whole-game scores either way."""
    clip_rewards: bool = True
    """Training rewards are clipped to their sign (reported training returns stay the raw
    game scores)."""
    fire_reset: bool = False
    """Press FIRE once after each new game's no-ops (games that wait for it to start, e.g.
    Breakout; the baselines' FireResetEnv). A ball lost later is served by the agent."""


@dataclass(frozen=True)
class EnvConfig(_Section):
    """The environments each actor steps."""

    SECTION: ClassVar[str] = "env"

    id: str = "CartPole-v1"
    """Gymnasium environment id; `package.module:Id-v0` imports the module first (which registers
    Id-v0), `package.module:MyEnv` names a gymnasium.Env class of your own (see easyrl.envs);
    with multiagent.policies set, a multi-agent env (see multiagent)."""
    num_envs: int = 8
    """Environments per actor, stepped together as one vector env."""
    vector: Literal["sync", "async", "envpool"] = "sync"
    """Vector env kind: sync (in-process), async (subprocesses: see envs_per_worker) or envpool
    (EnvPool's C++ threads, one per env up to the CPUs; Atari and classic-control ids;
    easyrl[envpool])."""
    envs_per_worker: int = 1
    """With vector async: envs each subprocess steps in turn (1: one subprocess per env). A
    subprocess per env costs every env a pipe round trip and a process wake-up per step; on
    fewer cores than envs, several envs per subprocess leave that CPU to the envs (Sample
    Factory's num_envs_per_worker; RESULTS.md has Pong's figures)."""
    max_episode_steps: int | None = None
    """Truncate episodes after this many steps (None: the environment's own limit)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Free-form keyword arguments passed to gymnasium.make."""
    atari: AtariConfig | None = None
    """Atari preprocessing; None: the environment as registered."""


@dataclass(frozen=True)
class EncoderConfig(_Section):
    """One encoder of an observation key (`model.encoders`): the keys of `model` that shape
    a network, without the LSTM."""

    SECTION: ClassVar[str] = "model.encoders.<key>"

    kind: str = "mlp"
    """Network family: mlp (flat observations), conv (image frames [H, W, C], e.g. Atari), or
    the `package.module:Class` path of a custom torso, a `tf.Module` or a Keras 3 layer/model
    (see easyrl.models.build_torso; every algorithm takes one)."""
    hidden: tuple[int, ...] = (64, 64)
    """Units of each hidden dense layer (for conv: the dense layers after the convolutions)."""
    activation: Literal["relu", "tanh", "elu"] = "relu"
    """Activation of the hidden layers."""
    conv: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    """conv only: (filters, kernel, stride) of each convolution. The default is the Nature-DQN
    torso for 84x84x4 frames (valid padding, hidden [512]); EasyRL's 42x42x4 shape is
    [[32, 3, 2], [32, 3, 2], [32, 3, 2], [32, 3, 2]] with same padding and hidden [256]."""
    padding: Literal["valid", "same"] = "valid"
    """conv only: padding of the convolutions."""


@dataclass(frozen=True)
class ModelConfig(EncoderConfig):
    """The network architecture."""

    SECTION: ClassVar[str] = "model"

    lstm: int = 0
    """Units of an LSTM core between the torso and the heads (0: none, a feed-forward policy).
    IMPALA, A3C and PPO (whose policy and value networks get one each), and R2D2, which
    needs it: actors carry the state per env, reset it at episode starts and ship each
    unroll's (PPO: each env's round sequence's; R2D2: each sequence's) initial state;
    learners unroll the core from it."""
    encoders: dict[str, EncoderConfig] = field(default_factory=dict)
    """Dict/Tuple observations only (Tuple keys: "0", "1", ...): {observation key: its
    encoder}. Each listed key's part of the observation, in its own shape (a Box's; the
    flattened vector of others), goes through its encoder; the encoders' features and the
    unlisted keys' flattened values, concatenated in the observation's key order, are the
    input of the torso the keys above describe (kind mlp or a custom path). Empty: one torso
    on the whole flattened observation. DQN, R2D2, IMPALA, A3C, PPO, A2C and PG."""


@dataclass(frozen=True)
class ReplayConfig(_Section):
    """The replay memory shards."""

    SECTION: ClassVar[str] = "replay"

    kind: str | None = None
    """Table kind (None: the algorithm's own), a name registered in easyrl.replay.kinds:
    uniform/prioritized replay (DQN), trajectory = a FIFO of unrolls (IMPALA), aggregate =
    whole rounds (PPO, ES), or a kind of your own."""
    capacity: int = 100_000
    """Items kept per memory shard (transitions; unrolls for a trajectory table)."""
    alpha: float = 0.6
    """Priority exponent (0: uniform)."""
    beta: float = 0.4
    """Initial importance-sampling exponent."""
    beta_final: float = 1.0
    """Importance-sampling exponent reached after `beta_anneal_steps`."""
    beta_anneal_steps: int = 0
    """Learner updates to anneal beta to beta_final over (0: constant beta)."""
    min_size_to_sample: int = 1000
    """Transitions a shard must hold before it serves samples."""
    samples_per_insert: float | None = None
    """Target ratio of sampled to inserted transitions (None: no ratio limit)."""
    error_buffer: float | None = None
    """Allowed deviation from samples_per_insert, in samples (None: the replay's default)."""
    prefetch: int = 2
    """Ready sample batches kept per shard."""
    frame_dedup: bool = True
    """With env.atari (frame_stack > 1): store each frame of the observation stacks once and
    rebuild the stacks when sampling (easyrl.replay.frames); false: whole stacks per item."""
    wal: Literal["group", "write", "none"] = "group"
    """The shard's write-ahead log (easyrl.roles.wal), beside its snapshots: an Insert is
    answered once its items are in the log, which a restarted shard replays over its newest
    snapshot. group: written and fsynced, one fsync per group of inserts (survives a lost
    machine); write: written, not fsynced (survives a killed process, not a lost machine);
    none: no log (a killed shard loses what it stored since its last snapshot)."""
    wal_sync_ms: float = 0.0
    """group: least milliseconds between two fsyncs (0: the next as soon as the last ends);
    more groups more inserts per fsync, and answers them later."""

    @property
    def kind_spec(self) -> replay_kinds.Kind | None:
        """The registered replay kind `kind` names (None: no replay memory)."""
        return None if self.kind is None else replay_kinds.get(self.kind)

    @property
    def prioritized(self) -> bool:
        """Whether items carry priorities: actors compute initial ones, learners send new
        ones back."""
        return self.kind_spec is not None and self.kind_spec.prioritized


@dataclass(frozen=True)
class ThreadsConfig(_Section):
    """Thread budget of each role's processes: the TensorFlow intra-op threads a process
    runs (its inter-op pool as many, at least 2), and the CPUs its Kubernetes pod requests
    (see easyrl.cluster.threads). 0: derived from the cores of the host and the processes
    placed on it."""

    SECTION: ClassVar[str] = "cluster.threads"

    ps: int = 0
    """A PS shard's threads (0: 1; applying a push took as long with 2, RESULTS.md)."""
    memory: int = 0
    """A memory shard's cores (0: 1; it never runs TensorFlow, so this only counts it on
    its host and sizes its pod's CPU request)."""
    learner: int = 0
    """A learner's threads (0: the host's cores the other processes on it leave, shared
    by the learners, at least 1; a pod: 2)."""
    actor: int = 0
    """An actor's threads (0: 1). Acting is small inference calls, which one thread runs
    faster: on 2 cores, Pong's 42x42 net took 0.33 instead of 0.53 ms on 5 observations,
    and `configs/pong_impala.yaml`'s actor stepped 15-25 % more (benchmarks/bench_actor.py).
    A large net on many envs wants more (the 84x84 net on 64 observations: 6.8 vs 3.7 ms)."""
    evaluator: int = 0
    """An evaluator's threads (0: 1)."""


@dataclass(frozen=True)
class ClusterConfig(_Section):
    """How many processes of each role run, and where."""

    SECTION: ClassVar[str] = "cluster"

    ps: int = 1
    """Parameter-server shards."""
    memory: int | None = None
    """Replay memory shards (None: 1, or 0 for an algorithm whose actors push gradients)."""
    learner: int | None = None
    """Learners (None: 1, or 0 for an algorithm whose actors push gradients)."""
    actor: int | None = None
    """Actors (None: 2; an offline run, `input.dir`, has none and keeps None)."""
    evaluator: int = 0
    """Evaluators (0 or 1): run the greedy policy on fresh envs every `eval.interval_s`."""
    host: str = "127.0.0.1"
    """Address the local launcher binds."""
    shared_memory: bool = True
    """Sampled batches go from a memory shard to a learner on the same host (a loopback
    address) through shared memory instead of gRPC's bytes (`easyrl.transport.shm`); false:
    always gRPC."""
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    """Per-process thread budgets of each role."""


@dataclass(frozen=True)
class ActorConfig(_Section):
    """Actor behaviour."""

    SECTION: ClassVar[str] = "actor"

    send_every: int = 8
    """Vector steps between shipments to memory."""
    weight_sync_every: int = 16
    """Vector steps between weight pulls from the PS."""
    queue_size: int = 8
    """Bounded sender queue, in shipments."""


@dataclass(frozen=True)
class LearnerConfig(_Section):
    """Learner behaviour."""

    SECTION: ClassVar[str] = "learner"

    batch_queue: int = 4
    """Sampled batches buffered ahead of the update loop."""
    batches_per_sample: int = 1
    """Replay flows: batches a learner asks a memory shard for in one Sample, each its own
    update (fewer calls: the transport's CPU per update shrinks by this factor). Under a
    rate limiter `replay.error_buffer` must be at least half of this many batches' items."""
    push_queue: int = 2
    """Gradient pushes buffered towards the PS."""
    push_threads: int = 2
    """Pushes in flight at once (each thread pushes to every PS shard; the replies carry the
    shards' newest values)."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """Device the learner computes on (auto: a GPU when one is visible)."""
    updates_per_report: int = 20
    """Updates between metric reports."""
    publish_every: int = 16
    """A run with one learner of a replay flow (DQN, IMPALA, DDPG/TD3, SAC, offline): the
    learner applies its updates itself and publishes its values (and now and then its
    optimizer state) to the PS shards every this many updates, for the actors, evaluators
    and checkpoints. 0, or several learners: every update's gradients go to the PS shards,
    which apply them (the learner pulls the values back)."""


@dataclass(frozen=True)
class StopConfig(_Section):
    """When a run stops; the first condition met wins (all None: run until interrupted)."""

    SECTION: ClassVar[str] = "stop"

    episode_return_mean: float | None = None
    """Stop once the mean return over the last `window` episodes reaches this."""
    eval_return_mean: float | None = None
    """Stop once an evaluation's mean return reaches this (needs cluster.evaluator: 1)."""
    window: int = 100
    """Episodes the mean return is taken over."""
    max_env_steps: int | None = None
    """Stop after this many env steps over all actors. The count grows as the actors'
    reports arrive (each actor reports about every half second), so a run stops up to one
    report per actor past it."""
    max_seconds: float | None = None
    """Stop after this many seconds of wall-clock time."""


@dataclass(frozen=True)
class EvalConfig(_Section):
    """The evaluator: the greedy/deterministic policy on fresh environments."""

    SECTION: ClassVar[str] = "eval"

    episodes: int = 10
    """Episodes per evaluation (their mean is the evaluation return)."""
    interval_s: float = 10.0
    """Seconds between the end of one evaluation and the start of the next."""
    num_envs: int = 10
    """Environments stepped together during an evaluation."""


@dataclass(frozen=True)
class OutputConfig(_Section):
    """Recording what the actors collect into a dataset (see easyrl.offline.dataset)."""

    SECTION: ClassVar[str] = "output"

    dir: str | None = None
    """Dataset directory the actors write their shards to (None: no recording); relative to
    the working directory. It must not hold shards yet."""
    max_file_mb: float = 32.0
    """An actor starts a new shard before its current one would pass this many MiB."""
    min_return_mean: float | None = None
    """Start recording once the actor's mean return over its last `stop.window` episodes
    reaches this (None: from the start)."""
    max_steps: int | None = None
    """Stop recording after this many steps in total over the actors (whole episodes, so a
    little more); the run then stops, successfully (None: record until the run stops)."""


@dataclass(frozen=True)
class InputConfig(_Section):
    """Training from a dataset instead of actors (an offline run)."""

    SECTION: ClassVar[str] = "input"

    dir: str | None = None
    """Dataset directory (None: online training); relative to the working directory. Memory
    shard i loads the dataset's shards k with k % cluster.memory == i; no actors run."""
    ope_episodes: int = 200
    """Logged episodes the evaluator estimates the policy's value on after each evaluation
    (importance sampling; needs behaviour probabilities in the dataset; 0: none)."""


@dataclass(frozen=True)
class RunConfig(_Section):
    """Run identity, output and periodic tasks."""

    SECTION: ClassVar[str] = "run"

    name: str = "run"
    """Run name, used in the output directory and the logs."""
    dir: str | None = None
    """Output directory (None: the launcher decides)."""
    seed: int = 0
    """Base random seed; each process derives its own from it."""
    deterministic: bool = False
    """Repeat exactly: two runs of one config write the same metrics.jsonl rows (time and
    rates aside), one per round. Synchronous rounds (ppo, es), one actor, no evaluator; see
    the README's "Seeds"."""
    checkpoint_interval_s: float = 60.0
    """Seconds between checkpoints."""
    log_interval_s: float = 2.0
    """Seconds between metric log lines."""
    rpc_timeout_s: float = 10.0
    """Deadline of one gRPC call, in seconds."""
    peer_timeout_s: float = 300.0
    """Seconds a worker waits at start for its PS and memory shards to answer the health check
    (and for the PS shards to hold weights) before it exits non-zero naming the ones missing."""
    crash_repeats: int = 3
    """`easyrl train`: a process that crashes with the same exception this many times within
    `crash_window_s` ends the run (a deterministic crash) instead of being restarted."""
    crash_window_s: float = 60.0
    """The window, in seconds, of `crash_repeats`."""
    prometheus_port: int | None = None
    """Serve Prometheus `/metrics` (plain HTTP, counters only) on every PS and memory shard
    at this port, plus the number of servers before it on the same host (PS shards, then
    memory shards: ps-0 on the port, then the next ports on one machine; None: off)."""


@dataclass(frozen=True)
class SecurityConfig(_Section):
    """Authentication and transport security of the gRPC channels."""

    SECTION: ClassVar[str] = "security"

    insecure: bool = False
    """Allow plaintext channels without a token."""
    token_file: str | None = None
    """File holding the shared bearer token."""
    tls_cert: str | None = None
    """PEM certificate chain of this process."""
    tls_key: str | None = None
    """PEM private key of tls_cert."""
    tls_ca: str | None = None
    """PEM CA bundle that peers' certificates are checked against."""
    max_message_mb: int | None = None
    """The largest gRPC message a PS or memory server takes or sends, in MiB; null: sized
    from the config (the largest legitimate message x 2, at least 4 MiB: a memory shard's
    largest Insert, Sample reply or round; a PS shard's weights)."""


@dataclass(frozen=True)
class MultiAgentConfig(_Section):
    """Multi-agent training: policies of the algorithm and which env agents each one plays
    (see easyrl.algorithms.multiagent). env.id then names a multi-agent env: a built-in one
    (easyrl/TwoRunners-v0) or package.module:factory returning a PettingZoo ParallelEnv
    (easyrl[multiagent])."""

    SECTION: ClassVar[str] = "multiagent"

    policies: tuple[str, ...] = ()
    """Policy names (empty: a single-agent run); each gets its own PS variables
    (`{policy}/...`), replay rows and metrics (`policy/{policy}/return_mean`). One name for
    all agents: a shared policy."""
    policy_mapping: dict[str, str] = field(default_factory=dict)
    """{agent id: policy} for the env's agents."""
    default_policy: str | None = None
    """The policy of agents policy_mapping leaves out (None: every agent must be mapped)."""
    agent_id: bool = False
    """Append each agent's one-hot index (its place in the env's possible_agents) to its
    observations (flat Box ones), so that one policy shared by several agents can tell them
    apart."""

    @property
    def enabled(self) -> bool:
        """Whether the run is multi-agent (it names policies)."""
        return bool(self.policies)


@dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithm: its registered name and its hyper-parameters."""

    name: str
    """Registered algorithm name (see easyrl.algorithms.registry.known()), or the name of an
    algorithm module of your own (e.g. my_pkg.my_algo; see easyrl.algorithms.registry)."""
    params: Any
    """The algorithm's frozen `Params` instance; flat next to `name` in YAML."""


@dataclass(frozen=True)
class Config:
    """A full run configuration."""

    algorithm: AlgorithmConfig
    """Algorithm name and hyper-parameters (the only required section)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environments."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Network architecture."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay memory."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Process counts."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Actor behaviour."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Learner behaviour."""
    stop: StopConfig = field(default_factory=StopConfig)
    """Stop conditions."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The evaluator."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run identity and periodic tasks."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """gRPC security."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Recording what the actors collect."""
    input: InputConfig = field(default_factory=InputConfig)
    """Training from a recorded dataset."""
    multiagent: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    """Multi-agent training (no policies: the env is a single-agent gymnasium env)."""


# ---------------------------------------------------------------------------------------------
# Value checks: the one declarative place. A field rule is (field, check); a cross-field rule is
# (predicate over the section, message). Both run in every section's __post_init__.


@dataclass(frozen=True)
class _Check:
    test: Callable[[Any], bool]
    text: str


def _ge(lo: float) -> _Check:
    return _Check(lambda v: v >= lo, f">= {lo}")


def _gt(lo: float) -> _Check:
    return _Check(lambda v: v > lo, f"> {lo}")


def _between(lo: float, hi: float) -> _Check:
    return _Check(lambda v: lo <= v <= hi, f"between {lo} and {hi}")


def _opt(check: _Check) -> _Check:
    return _Check(lambda v: v is None or check.test(v), f"null or {check.text}")


def _each(check: _Check) -> _Check:
    return _Check(lambda v: all(check.test(x) for x in v), f"all {check.text}")


_RULES: dict[type, dict[str, _Check]] = {
    EnvConfig: dict(num_envs=_ge(1), envs_per_worker=_ge(1), max_episode_steps=_opt(_ge(1))),
    AtariConfig: dict(noop_max=_ge(0), frame_skip=_ge(1), screen_size=_ge(8), frame_stack=_ge(1)),
    EncoderConfig: dict(
        kind=_Check(lambda v: v in ("mlp", "conv") or ":" in v, "mlp, conv or module:Class"),
        hidden=_each(_ge(1)),
        conv=_Check(lambda v: all(min(layer) >= 1 for layer in v), "all >= 1"),
    ),
    ReplayConfig: dict(
        capacity=_ge(1),
        alpha=_ge(0),
        beta=_between(0, 1),
        beta_final=_between(0, 1),
        beta_anneal_steps=_ge(0),
        min_size_to_sample=_ge(1),
        samples_per_insert=_opt(_gt(0)),
        error_buffer=_opt(_gt(0)),
        prefetch=_ge(1),
        wal_sync_ms=_between(0, 1000),
    ),
    ClusterConfig: dict(
        ps=_ge(1),
        memory=_opt(_ge(0)),
        learner=_opt(_ge(0)),
        actor=_Check(lambda v: v is None or v >= 1, ">= 1"),
        evaluator=_between(0, 1),
    ),
    ThreadsConfig: dict(ps=_ge(0), memory=_ge(0), learner=_ge(0), actor=_ge(0), evaluator=_ge(0)),
    SecurityConfig: dict(max_message_mb=_opt(_between(1, 2047))),
    EvalConfig: dict(episodes=_ge(1), interval_s=_ge(0), num_envs=_ge(1)),
    ActorConfig: dict(send_every=_ge(1), weight_sync_every=_ge(1), queue_size=_ge(1)),
    LearnerConfig: dict(
        batch_queue=_ge(1),
        batches_per_sample=_ge(1),
        push_queue=_ge(1),
        push_threads=_ge(1),
        updates_per_report=_ge(1),
        publish_every=_ge(0),
    ),
    StopConfig: dict(window=_ge(1), max_env_steps=_opt(_ge(1)), max_seconds=_opt(_gt(0))),
    OutputConfig: dict(max_file_mb=_gt(0), max_steps=_opt(_ge(1))),
    InputConfig: dict(ope_episodes=_ge(0)),
    RunConfig: dict(
        checkpoint_interval_s=_gt(0),
        log_interval_s=_gt(0),
        rpc_timeout_s=_gt(0),
        peer_timeout_s=_gt(0),
        crash_repeats=_ge(1),
        crash_window_s=_gt(0),
        prometheus_port=_opt(_between(1, 65535)),
    ),
}

_CROSS_RULES: dict[type, tuple[tuple[Callable[[Any], bool], str], ...]] = {
    EnvConfig: (
        (
            lambda e: e.envs_per_worker == 1 or e.vector == "async",
            "envs_per_worker applies to vector 'async' only (sync and envpool have no "
            "subprocesses)",
        ),
    ),
    ModelConfig: (
        (
            lambda m: not m.encoders or m.kind != "conv",
            "encoders need kind mlp or a module:Class torso to read their features (not conv)",
        ),
        (
            lambda m: all(re.fullmatch(r"[A-Za-z0-9_.-]+", k) for k in m.encoders),
            "encoders: keys are observation keys of letters, digits, '_', '.' and '-'",
        ),
    ),
    SecurityConfig: (
        (lambda s: (s.tls_cert is None) == (s.tls_key is None), "tls_cert and tls_key go together"),
    ),
    OutputConfig: (
        (
            lambda o: o.dir is not None or (o.max_steps is None and o.min_return_mean is None),
            "max_steps and min_return_mean need dir",
        ),
    ),
    MultiAgentConfig: (
        (
            lambda m: m.enabled or (not m.policy_mapping and m.default_policy is None),
            "policy_mapping and default_policy need policies",
        ),
    ),
}


def _validate(section: _Section) -> None:
    """Raises ConfigError naming the dotted key of the first value `section` breaks a rule with."""
    prefix = section.SECTION
    rules = {k: v for cls in type(section).__mro__[::-1] for k, v in _RULES.get(cls, {}).items()}
    for name, check in rules.items():
        value = getattr(section, name)
        if not check.test(value):
            raise ConfigError(f"{_join(prefix, name)} must be {check.text}, got {value!r}")
    for predicate, message in _CROSS_RULES.get(type(section), ()):
        if not predicate(section):
            raise ConfigError(f"{prefix}: {message}")


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)
