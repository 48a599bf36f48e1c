"""The run-directory tools: `easyrl rollout`, `easyrl export`, `easyrl plot`.

Run directories are made without training: the config is saved with `easyrl.config.save`,
the algorithm is built from it, and its variables are written the way a run writes them:
`ps-<i>.npz` by real `ParameterServer` shards (assigned as the workers shard them) and
`best.npz` by the evaluator's `BestCheckpoint`.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.cli import main
from easyrl.cluster.spec import assign_shards
from easyrl.envs import env_options, env_spaces
from easyrl.errors import EasyRLError
from easyrl.roles.evaluator import BestCheckpoint
from easyrl.tools.export import EXPORT_INFO, export
from easyrl.tools.plot import plot
from easyrl.tools.rollout import load_policy, rollout

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(tmp_path, name: str, raw: dict, ps_shards: int = 1):
    """A run directory with `config.yaml`; returns (run_dir, cfg, algo, ps_shards)."""
    run_dir = tmp_path / name
    cfg = config_lib.from_dict(
        {**raw, "cluster": {"ps": ps_shards}, "run": {"name": name, "dir": str(run_dir)}}
    )
    config_lib.save(cfg, run_dir / "config.yaml")
    obs_space, action_space = env_spaces(cfg.env.id, **env_options(cfg.env))
    module = registry.module(cfg.algorithm.name)
    algo = module.build(cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed)
    return run_dir, cfg, algo


def write_latest(run_dir, cfg, values: dict) -> None:
    """Writes `values` as the run's PS shards would checkpoint them."""
    from easyrl.roles.ps import ParameterServer
    from easyrl.transport import codec
    from easyrl.transport import easyrl_pb2 as pb

    sizes = [(n, v.nbytes) for n, v in values.items()]
    assignment = assign_shards(sizes, cfg.cluster.ps)
    module = registry.module(cfg.algorithm.name)
    for shard in range(cfg.cluster.ps):
        path = run_dir / "checkpoints" / f"ps-{shard}.npz"
        ps = ParameterServer(shard, module.optimizer(cfg.algorithm.params), 10, path)
        mine = {n: v for n, v in values.items() if assignment[n] == shard}
        ps.Assign(pb.AssignRequest(tensors=codec.encode_named(mine)), None)
        ps.checkpoint()


def write_best(run_dir, algo, values: dict) -> None:
    """Writes `values` as the evaluator's best checkpoint."""
    for name, value in values.items():
        algo.variables[name].assign(value)
    BestCheckpoint(run_dir / "checkpoints" / "best.npz").offer(1.0, algo.variables, {})


def random_values(algo, seed: int) -> dict:
    """Random float32 values for every variable of `algo` (non-trivial weights)."""
    rng = np.random.default_rng(seed)
    return {
        n: rng.normal(0.0, 0.5, tuple(v.shape)).astype(np.float32)
        for n, v in algo.variables.items()
    }


def always(algo, action: int) -> dict:
    """DQN weights whose greedy action is `action` for every observation: zero weights and
    an advantage bias that prefers `action`."""
    values = {n: np.zeros(tuple(v.shape), np.float32) for n, v in algo.variables.items()}
    (bias,) = [n for n in values if n.endswith("advantage/b")]
    values[bias][action] = 1.0
    return values


DQN = {"algorithm": {"name": "dqn"}, "env": {"id": "CartPole-v1"}, "model": {"hidden": [8]}}


@pytest.fixture
def dqn_run(tmp_path):
    """A DQN run whose best weights always push left and whose latest always push right,
    its variables split over two PS shards."""
    run_dir, cfg, algo = make_run(tmp_path, "cartpole-dqn", DQN, ps_shards=2)
    write_latest(run_dir, cfg, always(algo, 1))
    write_best(run_dir, algo, always(algo, 0))
    return run_dir


def test_rollout_prints_every_episode_and_the_mean(dqn_run, capsys):
    assert main(["rollout", str(dqn_run), "--episodes", "3", "--seed", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    episodes = [line for line in lines if line.startswith("episode ")]
    assert [line.split(":")[0] for line in episodes] == ["episode 1", "episode 2", "episode 3"]
    # Always pushing one way topples the pole within a few steps: return == length.
    for line in episodes:
        ret, length = line.split("return ")[1].split(", length ")
        assert float(ret) == int(length) < 30
    assert lines[-1].startswith("mean return ") and "over 3 episode(s)" in lines[-1]
    assert "best checkpoint (best.npz)" in lines[0]


def test_best_and_latest_load_their_own_weights(dqn_run):
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    best = load_policy(dqn_run)  # best.npz exists: the default
    assert best.checkpoint == "best" and np.all(best.algo.greedy(obs) == 0)
    latest = load_policy(dqn_run, "latest")  # the union of ps-0.npz and ps-1.npz
    assert [p.name for p in latest.files] == ["ps-0.npz", "ps-1.npz"]
    assert np.all(latest.algo.greedy(obs) == 1)
    result = rollout(dqn_run, episodes=2, checkpoint="latest", quiet=True)
    assert result.checkpoint == "latest" and len(result.returns) == len(result.lengths) == 2
    (dqn_run / "checkpoints" / "best.npz").unlink()
    assert load_policy(dqn_run).checkpoint == "latest"  # no best: the PS shards'


def test_missing_run_checkpoint_or_variable_is_a_clear_error(tmp_path, dqn_run, capsys):
    assert main(["rollout", str(tmp_path / "nope")]) == 2
    assert "easyrl: error: run directory" in capsys.readouterr().err
    (dqn_run / "checkpoints" / "ps-1.npz").unlink()
    with pytest.raises(EasyRLError, match=r"lacks \d+ variable\(s\).*only 1 of the run's 2 PS"):
        load_policy(dqn_run, "latest")
    (dqn_run / "checkpoints" / "ps-0.npz").unlink()
    (dqn_run / "checkpoints" / "best.npz").unlink()
    with pytest.raises(EasyRLError, match=r"no PS checkpoint .* and no best.npz either"):
        rollout(dqn_run, quiet=True)
    with pytest.raises(EasyRLError, match="no best checkpoint"):
        load_policy(dqn_run, "best")


def test_video_without_moviepy_names_what_to_install(dqn_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "moviepy", None)  # makes `import moviepy` fail
    with pytest.raises(EasyRLError, match="pip install moviepy"):
        rollout(dqn_run, episodes=1, video_dir=tmp_path / "videos", quiet=True)


def test_video_records_every_episode(dqn_run, tmp_path):
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")  # CartPole renders its frames with pygame
    videos = tmp_path / "videos"
    assert main(["rollout", str(dqn_run), "--episodes", "2", "--video", str(videos)]) == 0
    names = sorted(p.name for p in videos.iterdir())
    assert names == ["rollout-episode-0.mp4", "rollout-episode-1.mp4"]


LOAD_WITH_PLAIN_TF = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    cases = json.loads(sys.argv[1])
    actions = {}
    for name, (model_dir, obs_file) in cases.items():
        policy = tf.saved_model.load(model_dir)
        obs = tf.constant(np.load(obs_file))
        actions[name] = policy.signatures["action"](obs=obs)["action"].numpy()
    np.savez(sys.argv[2], **actions)
    assert "easyrl" not in sys.modules, "the SavedModel pulled in easyrl"
    """
)


@pytest.mark.cluster
def test_exported_policies_run_with_plain_tensorflow(tmp_path, capsys):
    runs = {
        "dqn": DQN,
        "ppo": {
            "algorithm": {"name": "ppo", "normalize_observations": True},
            "env": {"id": "Pendulum-v1"},
            "model": {"hidden": [8]},
        },
        "sac": {
            "algorithm": {"name": "sac"},
            "env": {"id": "Pendulum-v1"},
            "model": {"hidden": [8]},
        },
        "impala": {  # a Dict observation with an action mask, and a per-key encoder
            "algorithm": {"name": "impala"},
            "env": {"id": "easyrl/MaskedChoice-v0"},
            "model": {"hidden": [8], "encoders": {"payoff": {"hidden": [4]}}},
        },
    }
    cases, expected = {}, {}
    for seed, (name, raw) in enumerate(runs.items()):
        run_dir, cfg, algo = make_run(tmp_path, name, raw)
        values = random_values(algo, seed)
        if name == "ppo":  # observation statistics: the variance must stay positive
            values["obs_norm/var"] = np.abs(values["obs_norm/var"]) + 0.5
        write_latest(run_dir, cfg, values)
        out = tmp_path / "export" / name
        if name == "dqn":
            assert main(["export", str(run_dir), "--out", str(out)]) == 0
            assert f"saved the policy to {out}" in capsys.readouterr().out
        else:
            export(run_dir, out)
        obs_space = env_spaces(cfg.env.id)[0]
        obs_space.seed(seed)
        obs = np.stack([obs_space.sample() for _ in range(32)]).astype(np.float32)
        np.save(tmp_path / f"{name}-obs.npy", obs)
        cases[name] = (str(out), str(tmp_path / f"{name}-obs.npy"))
        expected[name] = load_policy(run_dir).algo.greedy(obs)
        info = json.loads((out / EXPORT_INFO).read_text())
        assert info["algorithm"] == name and info["env_id"] == cfg.env.id
        assert info["input"] == {"name": "obs", "shape": [None, *obs.shape[1:]], "dtype": "float32"}
        assert info["checkpoint"] == "latest"
    assert json.loads((tmp_path / "export" / "sac" / EXPORT_INFO).read_text())["action_space"] == {
        "type": "Box",
        "shape": [1],
        "dtype": "float32",
        "low": [-2.0],
        "high": [2.0],
    }
    result = tmp_path / "actions.npz"
    subprocess.run(
        [sys.executable, "-c", LOAD_WITH_PLAIN_TF, json.dumps(cases), str(result)],
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        check=True,
        timeout=120,
    )
    with np.load(result) as actions:
        assert actions["dqn"].dtype == np.int64
        np.testing.assert_array_equal(actions["dqn"], expected["dqn"])
        assert len(set(expected["dqn"].tolist())) == 2  # random weights: both actions occur
        np.testing.assert_array_equal(actions["impala"], expected["impala"])
        assert len(set(expected["impala"].tolist())) > 1
        for name in ("ppo", "sac"):
            assert actions[name].shape == expected[name].shape == (32, 1)
            np.testing.assert_allclose(actions[name], expected[name], rtol=1e-6, atol=1e-6)


def test_export_refuses_a_foreign_non_empty_directory(dqn_run, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(EasyRLError, match="non-empty directory"):
        export(dqn_run, tmp_path / "busy")


def write_metrics(run_dir, evaluations: bool) -> None:
    """A short metrics.jsonl: no return on the first line, as a real run's starts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"time_s": 1.0, "env_steps": 0, "updates": 0}]
    for i in range(1, 6):
        record = {"time_s": 1.0 + 2 * i, "env_steps": 1000 * i, "return_mean": 10.0 * i}
        if evaluations and i >= 2:  # every line repeats the newest evaluation
            count = i // 2
            record.update(
                eval_return_mean=20.0 * count, eval_count=count, eval_at_env_steps=2000 * count
            )
        records.append(record)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (run_dir / "metrics.jsonl").write_text(text + '{"time_s": 13.0, "env_st')  # torn last line


def test_plot_writes_a_png_of_several_runs(tmp_path, capsys):
    write_metrics(tmp_path / "a", evaluations=False)
    write_metrics(tmp_path / "b", evaluations=True)
    out = tmp_path / "plots" / "curve.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_plot_errors_name_the_run_and_the_missing_package(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    out = str(tmp_path / "curve.png")
    assert main(["plot", str(tmp_path / "empty"), "--out", out]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "metrics.jsonl").write_text('{"time_s": 1.0, "env_steps": 0}\n')
    with pytest.raises(EasyRLError, match="no episode return yet"):
        plot([tmp_path / "early"], out)
    write_metrics(tmp_path / "a", evaluations=False)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(EasyRLError, match=r"pip install -e '\.\[plot\]'"):
        plot([tmp_path / "a"], out)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_tools_on_the_run_directory_of_a_real_training_run(tmp_path):
    """A short real `easyrl train` (PPO on CartPole with an evaluator) leaves a run directory
    that rollout (best and latest), export (loaded without easyrl) and plot all work on."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("EASYRL_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    overrides = (
        f"run.dir={run_dir}",
        "stop.episode_return_mean=null",
        "stop.max_env_steps=6000",
        "cluster.evaluator=1",
        "eval.interval_s=1",
        "eval.episodes=2",
        "run.log_interval_s=0.5",
    )
    command = [sys.executable, "-m", "easyrl.cli", "train", f"{root}/configs/cartpole_ppo.yaml"]
    for override in overrides:
        command += ["--set", override]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run_dir / "checkpoints" / "ps-0.npz").exists()
    assert (run_dir / "checkpoints" / "best.npz").exists(), "the evaluator saved no best policy"

    for which in ("best", "latest"):
        result = rollout(run_dir, episodes=2, checkpoint=which, seed=3)
        assert len(result.returns) == 2 and all(r >= 1 for r in result.returns), result

    out = tmp_path / "exported"
    export(run_dir, out)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    cases = {"ppo": (str(out), str(tmp_path / "obs.npy"))}
    subprocess.run(
        [sys.executable, "-c", LOAD_WITH_PLAIN_TF, json.dumps(cases), str(tmp_path / "a.npz")],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=120,
    )
    with np.load(tmp_path / "a.npz") as actions:
        np.testing.assert_array_equal(actions["ppo"], load_policy(run_dir).algo.greedy(obs))

    image = plot([run_dir], tmp_path / "curve.png")
    assert image.read_bytes()[:8] == PNG_MAGIC and image.stat().st_size > 10_000


@pytest.mark.cluster
def test_rollout_and_export_of_a_custom_env_run_work_from_where_it_was_started(
    tmp_path, monkeypatch
):
    # A user's directory holding the env module; the run names it by a module:Class path.
    example = Path(__file__).resolve().parent.parent / "examples" / "custom" / "my_envs.py"
    (tmp_path / "my_envs.py").write_text(example.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))  # only to build the run here
    raw = {**DQN, "env": {"id": "my_envs:Corridor", "kwargs": {"length": 4, "max_steps": 10}}}
    run_dir, cfg, algo = make_run(tmp_path, "corridor", raw)
    write_latest(run_dir, cfg, random_values(algo, 0))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # As the `easyrl` console script runs: -P keeps the current directory off sys.path.
    script = "import sys; from easyrl.cli import main; sys.exit(main())"
    easyrl = [sys.executable, "-P", "-c", script]
    for args in (["rollout", "corridor", "--episodes", "1"], ["export", "corridor", "--out", "x"]):
        done = subprocess.run(
            [*easyrl, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "x" / "saved_model.pb").is_file()
    # Elsewhere the module is not found, and the error says where easyrl looked.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [*easyrl, "rollout", str(run_dir), "--episodes", "1"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "No module named 'my_envs'" in done.stderr
    assert "PYTHONPATH" in done.stderr
