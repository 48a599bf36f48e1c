"""RLlib 2.60 (new API stack) on Atari Pong, run by `bench_pong_peers.py` in RLlib's own Python.

    python rllib_pong.py IMPALA|APPO SECONDS

`ALE/Pong-v5` without sticky actions, through RLlib's own Atari pipeline
(`wrap_atari_for_new_api_stack`: 84x84 grayscale, frame skip 4 with max-pooling, 30 noops,
episodic life, frame stack 4; rewards clipped), the Nature-DQN conv net with a shared value
head (the network easyrl's 84x84 row and Sample Factory use), 2 env runners of 8 envs each,
the learner in the driver process, CPU only. The rest is RLlib's defaults for the algorithm.
Prints one JSON line per training iteration (seconds since start, agent steps sampled,
mean return of the last 20 episodes) until SECONDS have passed.
"""

import json
import sys
import time

import ale_py
import gymnasium as gym
import ray
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
from ray.tune.registry import register_env


def make_env(cfg):
    gym.register_envs(ale_py)  # in each env runner's process
    env = gym.make("ALE/Pong-v5", **cfg)
    return wrap_atari_for_new_api_stack(env, dim=84, framestack=4)


def main() -> None:
    name, seconds = sys.argv[1], float(sys.argv[2])
    start = time.monotonic()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    register_env("pong", make_env)
    if name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig as Config
    else:
        from ray.rllib.algorithms.impala import IMPALAConfig as Config
    config = (
        Config()
        .environment(
            "pong",
            env_config={"frameskip": 1, "repeat_action_probability": 0.0},
            clip_rewards=True,
        )
        .env_runners(num_env_runners=2, num_envs_per_env_runner=8, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .rl_module(
            model_config=DefaultModelConfig(
                conv_filters=[(32, 8, 4), (64, 4, 2), (64, 3, 1)],
                conv_activation="relu",
                head_fcnet_hiddens=[512],
                vf_share_layers=True,
            )
        )
        .reporting(metrics_num_episodes_for_smoothing=20)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    while time.monotonic() - start < seconds:
        result = algo.train()
        runners = result.get("env_runners", {})
        steps = int(
            result.get("num_env_steps_sampled_lifetime")
            or runners.get("num_env_steps_sampled_lifetime")
            or 0
        )
        ret = runners.get("episode_return_mean")
        print(
            json.dumps(
                {
                    "time_s": time.monotonic() - start,
                    "env_steps": steps,
                    "return_mean": None if ret is None or ret != ret else float(ret),
                }
            ),
            flush=True,
        )
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
