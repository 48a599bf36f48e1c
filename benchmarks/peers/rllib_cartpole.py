"""RLlib (new API stack) on CartPole-v1, run by `bench_peers.py` in the peers' own Python.

    python rllib_cartpole.py PPO|APPO|DQN BUDGET_STEPS CORES WINDOW

RLlib's own defaults for each algorithm (`PPOConfig()`, ...), one env runner; Ray gets
CORES CPUs. Prints one JSON line of progress (env steps, episodes, trailing mean return
of WINDOW episodes) per training iteration.
"""

import json
import sys

import ray


def main() -> None:
    name, budget, cores, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    if name == "PPO":
        from ray.rllib.algorithms.ppo import PPOConfig as Config
    elif name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig as Config
    else:
        from ray.rllib.algorithms.dqn import DQNConfig as Config
    config = (
        Config()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .reporting(metrics_num_episodes_for_smoothing=window)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    while True:
        result = algo.train()
        runners = result.get("env_runners", {})
        steps = int(
            result.get("num_env_steps_sampled_lifetime")
            or runners.get("num_env_steps_sampled_lifetime")
            or 0
        )
        mean = runners.get("episode_return_mean")
        if mean is not None:
            record = {
                "steps": steps,
                "episodes": int(runners.get("num_episodes_lifetime", 0)),
                "return_mean": float(mean),
            }
            print(json.dumps(record), flush=True)
        if steps >= budget:
            break


if __name__ == "__main__":
    main()
