"""Tests of easyrl.config: defaults, round trips, strict key/type/value checks, overrides."""

import dataclasses
import subprocess
import sys
import typing

import pytest
import yaml

from easyrl import config
from easyrl.algorithms import dqn
from easyrl.errors import ConfigError

MINIMAL = {"algorithm": {"name": "dqn"}}


def load(raw=None, overrides=()):
    return config.from_dict(MINIMAL if raw is None else raw, overrides)


def test_defaults_from_minimal_mapping():
    cfg = load()
    assert cfg.algorithm.name == "dqn"
    assert cfg.algorithm.params == dqn.Params()
    assert cfg.env == config.EnvConfig()
    assert cfg.env.id == "CartPole-v1" and cfg.env.num_envs == 8 and cfg.env.kwargs == {}
    assert cfg.model.hidden == (64, 64)
    assert cfg.replay.kind == "prioritized" and cfg.replay.capacity == 100_000
    assert cfg.replay.samples_per_insert is None
    assert (cfg.cluster.ps, cfg.cluster.memory, cfg.cluster.learner, cfg.cluster.actor) == (
        1,
        1,
        1,
        2,
    )
    assert cfg.learner.device == "auto"
    assert cfg.stop.window == 100 and cfg.stop.episode_return_mean is None
    assert cfg.run.dir is None and cfg.run.checkpoint_interval_s == 60.0
    assert cfg.security.insecure is False


def test_config_is_frozen():
    cfg = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.replay.capacity = 3  # type: ignore[misc]


def test_every_field_has_a_docstring_and_default():
    from easyrl.tools.config_reference import field_docs

    sections = [
        config.EnvConfig,
        config.ModelConfig,
        config.EncoderConfig,
        config.ReplayConfig,
        config.ClusterConfig,
        config.ActorConfig,
        config.LearnerConfig,
        config.StopConfig,
        config.RunConfig,
        config.SecurityConfig,
    ]
    for cls in sections:
        documented = field_docs(cls)  # raises ValueError naming a field without one
        for f in dataclasses.fields(cls):
            assert f.name in documented, f"{cls.__name__}.{f.name} lacks a docstring"
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            assert has_default, f"{cls.__name__}.{f.name} lacks a default"


def test_full_file_round_trip(tmp_path):
    text = """
algorithm: {name: dqn, gamma: 0.95, n_step: 5, lr: 1e-4, optimizer: rmsprop}
env: {id: LunarLander-v3, num_envs: 4, vector: async, max_episode_steps: 500,
      kwargs: {continuous: false, gravity: -9.8}}
model: {hidden: [128, 128, 64], activation: tanh}
replay: {kind: uniform, capacity: 5000, min_size_to_sample: 100, samples_per_insert: 4,
         error_buffer: 100.5, beta_anneal_steps: 10000, prefetch: 3}
cluster: {ps: 2, memory: 3, learner: 1, actor: 8, host: 0.0.0.0}
actor: {send_every: 4, weight_sync_every: 32, queue_size: 16}
learner: {batch_queue: 8, push_queue: 1, device: cpu, updates_per_report: 50}
stop: {episode_return_mean: 200, window: 20, max_env_steps: 1000000, max_seconds: 3600}
run: {name: lunar, dir: /tmp/runs/lunar, seed: 7, checkpoint_interval_s: 30}
security: {insecure: true, token_file: tok.txt}
"""
    path = tmp_path / "in.yaml"
    path.write_text(text)
    cfg = config.load(path)
    assert cfg.algorithm.params.lr == pytest.approx(1e-4)
    assert isinstance(cfg.algorithm.params.lr, float)
    assert cfg.algorithm.params.optimizer == "rmsprop"
    assert cfg.env.kwargs == {"continuous": False, "gravity": -9.8}
    assert cfg.model.hidden == (128, 128, 64)
    assert cfg.replay.samples_per_insert == 4.0 and isinstance(cfg.replay.samples_per_insert, float)
    assert cfg.stop.episode_return_mean == 200.0
    assert isinstance(cfg.stop.episode_return_mean, float)
    assert cfg.cluster.memory == 3 and cfg.cluster.host == "0.0.0.0"

    out = tmp_path / "sub" / "out.yaml"
    config.save(cfg, out)
    assert config.load(out) == cfg
    assert config.from_dict(config.to_dict(cfg)) == cfg

    plain = yaml.safe_load(out.read_text())
    assert plain["algorithm"]["name"] == "dqn"
    assert plain["algorithm"]["gamma"] == 0.95  # params flat next to the name
    assert "params" not in plain["algorithm"]
    assert plain["model"]["hidden"] == [128, 128, 64]
    assert yaml.safe_load(config.dump(cfg)) == config.to_dict(cfg)


def test_to_dict_is_plain_yaml():
    d = config.to_dict(load())
    assert isinstance(d["model"]["hidden"], list)
    # safe_dump refuses tuples and other non-plain types
    yaml.safe_dump(d)
    assert config.from_dict(d) == load()


def test_load_empty_and_missing_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="algorithm"):
        config.load(empty)
    assert config.load(empty, ["algorithm.name=dqn"]) == load()
    with pytest.raises(ConfigError, match="nope.yaml"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        config.load(bad)


# ------------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match=r"unknown key 'replai'; did you mean 'replay'\?"):
        load({**MINIMAL, "replai": {}})


def test_unknown_section_key_suggests_closest():
    with pytest.raises(
        ConfigError, match=r"unknown key 'replay\.capacty'; did you mean 'replay\.capacity'\?"
    ):
        load({**MINIMAL, "replay": {"capacty": 10}})


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        load({**MINIMAL, "cluster": {"zzzzzz": 1}})
    msg = str(info.value)
    assert "cluster.zzzzzz" in msg
    for key in ("ps", "memory", "learner", "actor", "host"):
        assert key in msg


def test_unknown_algorithm_param():
    with pytest.raises(
        ConfigError, match=r"unknown key 'algorithm\.gama'; did you mean 'algorithm\.gamma'\?"
    ):
        load({"algorithm": {"name": "dqn", "gama": 0.9}})


# ------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("replay", "capacity", "big", r"replay\.capacity: expected int, got str 'big'"),
        ("replay", "capacity", True, r"replay\.capacity: expected int, got bool True"),
        ("replay", "capacity", 1.5, r"replay\.capacity: expected int, got float 1\.5"),
        ("replay", "alpha", [1, 2], r"replay\.alpha: expected float, got list \[1, 2\]"),
        ("replay", "alpha", False, r"replay\.alpha: expected float, got bool False"),
        ("replay", "alpha", "fast", r"replay\.alpha: expected float, got str 'fast'"),
        ("run", "seed", None, r"run\.seed: expected int, got null"),
        ("run", "name", None, r"run\.name: expected str, got null"),
        ("run", "name", 3, r"run\.name: expected str, got int 3"),
        ("security", "insecure", 1, r"security\.insecure: expected bool, got int 1"),
        (
            "stop",
            "max_env_steps",
            "lots",
            r"stop\.max_env_steps: expected int \| None, got str 'lots'",
        ),
        ("model", "hidden", 64, r"model\.hidden: expected list of int, got int 64"),
        ("model", "hidden", [64, "x"], r"model\.hidden\[1\]: expected int, got str 'x'"),
        ("env", "kwargs", [1], r"env\.kwargs: expected mapping, got list \[1\]"),
    ],
)
def test_wrong_types(section, key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        load({**MINIMAL, section: {key: value}})


def test_literal_lists_allowed_values():
    with pytest.raises(ConfigError) as info:
        load({**MINIMAL, "env": {"vector": "thread"}})
    msg = str(info.value)
    assert "env.vector" in msg and "'thread'" in msg
    assert "'sync'" in msg and "'async'" in msg
    with pytest.raises(ConfigError, match=r"'adam', 'rmsprop', 'sgd'"):
        load({"algorithm": {"name": "dqn", "optimizer": "lion"}})


def test_int_becomes_float_and_float_strings_parse():
    cfg = load({"algorithm": {"name": "dqn", "lr": "1e-3", "gamma": 1}, "replay": {"alpha": 1}})
    assert cfg.algorithm.params.lr == pytest.approx(1e-3)
    assert type(cfg.algorithm.params.gamma) is float
    assert type(cfg.replay.alpha) is float


def test_optional_accepts_null():
    cfg = load({**MINIMAL, "env": {"max_episode_steps": None}, "run": {"dir": None}})
    assert cfg.env.max_episode_steps is None and cfg.run.dir is None
    cfg = load({**MINIMAL, "env": {"max_episode_steps": 200}})
    assert cfg.env.max_episode_steps == 200


def test_section_not_a_mapping():
    with pytest.raises(ConfigError, match=r"replay: expected a mapping, got int 3"):
        load({**MINIMAL, "replay": 3})
    with pytest.raises(ConfigError, match=r"^stop: expected a mapping, got null"):
        load({**MINIMAL, "stop": None})
    with pytest.raises(ConfigError, match=r"algorithm"):
        load({"algorithm": "dqn"})
    with pytest.raises(ConfigError, match="mapping"):
        config.from_dict([1, 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------------- algorithm


def test_algorithm_name_required():
    with pytest.raises(ConfigError, match=r"algorithm\.name"):
        load({"algorithm": {"gamma": 0.9}})
    with pytest.raises(ConfigError, match=r"algorithm"):
        load({})


def test_unknown_algorithm_lists_known():
    with pytest.raises(
        ConfigError,
        match=r"unknown algorithm 'ppg'; known algorithms: a2c, a3c, .*pg, ppo, r2d2, sac",
    ):
        load({"algorithm": {"name": "ppg"}})


def test_algorithm_name_must_be_str():
    with pytest.raises(ConfigError, match=r"algorithm\.name: expected str, got int 3"):
        load({"algorithm": {"name": 3}})


# ------------------------------------------------------------------------- overrides


def test_overrides():
    cfg = load(
        overrides=[
            "replay.capacity=5000",
            "algorithm.lr=1e-3",
            "model.hidden=[32,32]",
            "stop.episode_return_mean=null",
            "env.kwargs.render_mode=rgb_array",
            "security.insecure=true",
        ]
    )
    assert cfg.replay.capacity == 5000
    assert cfg.algorithm.params.lr == pytest.approx(1e-3)
    assert isinstance(cfg.algorithm.params.lr, float)
    assert cfg.model.hidden == (32, 32)
    assert cfg.stop.episode_return_mean is None
    assert cfg.env.kwargs == {"render_mode": "rgb_array"}
    assert cfg.security.insecure is True


def test_override_replaces_file_value_and_later_wins():
    raw = {**MINIMAL, "stop": {"episode_return_mean": 195.0}}
    cfg = config.from_dict(
        raw,
        [
            "stop.episode_return_mean=null",
            "replay.capacity=7",
            "replay.capacity=9",
            "replay.min_size_to_sample=1",
        ],
    )
    assert cfg.stop.episode_return_mean is None
    assert cfg.replay.capacity == 9
    assert raw["stop"]["episode_return_mean"] == 195.0  # input untouched


def test_apply_overrides_creates_mappings_and_copies():
    raw = {"a": {"b": 1}}
    out = config.apply_overrides(raw, ["a.c=2", "x.y.z=[1, 2]", "a.b=hello"])
    assert out == {"a": {"b": "hello", "c": 2}, "x": {"y": {"z": [1, 2]}}}
    assert raw == {"a": {"b": 1}}


def test_override_of_unknown_key_suggests():
    with pytest.raises(
        ConfigError, match=r"unknown key 'replay\.capacty'; did you mean 'replay\.capacity'\?"
    ):
        load(overrides=["replay.capacty=5000"])
    with pytest.raises(ConfigError, match=r"did you mean 'algorithm\.gamma'\?"):
        load(overrides=["algorithm.gama=0.9"])


@pytest.mark.parametrize("bad", ["replay.capacity", "=3", "replay..capacity=3", "replay.=3"])
def test_malformed_override(bad):
    with pytest.raises(ConfigError, match="malformed override") as info:
        load(overrides=[bad])
    assert repr(bad) in str(info.value)


def test_override_into_non_mapping():
    with pytest.raises(ConfigError, match=r"'replay'.*not a mapping"):
        config.apply_overrides({"replay": 3}, ["replay.capacity=1"])


def test_override_type_errors_are_checked():
    with pytest.raises(ConfigError, match=r"replay\.capacity: expected int, got str 'big'"):
        load(overrides=["replay.capacity=big"])


# ------------------------------------------------------------------------- value checks


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.actor=0", "cluster.actor"),
        ("cluster.ps=0", "cluster.ps"),
        ("cluster.memory=-1", "cluster.memory"),
        ("cluster.learner=-1", "cluster.learner"),
        ("env.num_envs=0", "env.num_envs"),
        ("replay.capacity=0", "replay.capacity"),
        ("replay.alpha=-0.1", "replay.alpha"),
        ("replay.beta=1.5", "replay.beta"),
        ("replay.beta=-0.5", "replay.beta"),
        ("stop.window=0", "stop.window"),
        ("run.checkpoint_interval_s=0", "run.checkpoint_interval_s"),
        ("run.log_interval_s=-1", "run.log_interval_s"),
        ("run.rpc_timeout_s=0", "run.rpc_timeout_s"),
        ("model.hidden=[64, 0]", "model.hidden"),
    ],
)
def test_value_checks(override, key):
    with pytest.raises(ConfigError) as info:
        load(overrides=[override])
    assert str(info.value).startswith(key + " must be"), str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [  # DQN's (Ape-X's) hyper-parameters are checked when the config loads, like every section
        ("algorithm.gamma=2", "dqn: gamma must be in [0, 1], got 2.0"),
        ("algorithm.n_step=0", "dqn: n_step must be >= 1, got 0"),
        ("algorithm.batch_size=0", "dqn: batch_size must be >= 1, got 0"),
        ("algorithm.lr=-1", "dqn: lr must be finite and > 0, got -1.0"),
        ("algorithm.lr=.nan", "dqn: lr must be finite and > 0, got nan"),
        ("algorithm.epsilon=1.5", "dqn: epsilon must be in [0, 1], got 1.5"),
        ("algorithm.target_update_period=0", "dqn: target_update_period must be >= 1, got 0"),
    ],
)
def test_dqn_params_are_checked_at_load(override, message):
    with pytest.raises(ConfigError) as info:
        load(overrides=[override])
    assert str(info.value) == message


def test_value_check_message_and_boundaries():
    with pytest.raises(ConfigError, match=r"^cluster\.actor must be >= 1, got 0$"):
        load(overrides=["cluster.actor=0"])
    cfg = load(overrides=["replay.alpha=0", "replay.beta=0", "replay.beta_final=1"])
    assert (cfg.replay.alpha, cfg.replay.beta) == (0.0, 0.0)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match=r"replay: min_size_to_sample"):
        load(overrides=["replay.capacity=10", "replay.min_size_to_sample=11"])
    with pytest.raises(ConfigError, match=r"security: tls_cert and tls_key"):
        load(overrides=["security.tls_cert=cert.pem"])


def test_direct_construction_is_checked_too():
    with pytest.raises(ConfigError, match=r"cluster\.actor must be >= 1"):
        config.ClusterConfig(actor=0)
    cfg = load()
    with pytest.raises(ConfigError, match=r"replay\.capacity"):
        dataclasses.replace(cfg.replay, capacity=0)


# ------------------------------------------------------------------------- hygiene


def test_every_section_field_type_is_loadable():
    # The generic loader must understand every field type; defaults must round-trip.
    for f in dataclasses.fields(config.Config):
        if f.name == "algorithm":
            continue
        section = typing.get_type_hints(config.Config)[f.name]
        raw = config.to_dict(section())
        assert config.from_dict({**MINIMAL, f.name: raw}) == load()


@pytest.mark.cluster
def test_import_does_not_pull_tensorflow():
    code = "import sys, easyrl.config; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "algorithm, cluster, message",
    [
        ("dqn", {"learner": 0}, "cluster.learner: dqn needs at least one learner"),
        ("dqn", {"memory": 0}, "cluster.memory: dqn needs at least one memory"),
        ("ppo", {"learner": 2}, "cluster.learner: ppo trains synchronous rounds on one"),
        ("ppo", {"memory": 3, "actor": 2}, "cluster.memory: 3 memory shards but only 2"),
        ("dqn", {}, None),
    ],
)
def test_cluster_shape_must_suit_the_flow(algorithm, cluster, message):
    raw = {"algorithm": {"name": algorithm}, "cluster": cluster}
    if message is None:
        cfg = load(raw)
        assert (cfg.cluster.memory, cfg.cluster.learner) == (1, 1)
        return
    with pytest.raises(ConfigError, match=message):
        load(raw)


def test_replay_kind_defaults_to_the_algorithms_and_must_suit_it():
    assert load({"algorithm": {"name": "dqn"}}).replay.kind == "prioritized"
    assert load({"algorithm": {"name": "ppo"}}).replay.kind == "aggregate"
    with pytest.raises(ConfigError, match="replay.kind: ppo works with aggregate, got 'uniform'"):
        load({"algorithm": {"name": "ppo"}, "replay": {"kind": "uniform"}})
