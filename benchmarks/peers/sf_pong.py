"""Sample Factory 2 APPO on Atari Pong (run by the peers' Python, see bench_pong_peers.py).

`sf_examples.atari.train_atari` with one change: ale_py is imported first, which registers
the ALE environments with gymnasium 0.29 (Sample Factory's workers only import gymnasium).
At module level, so that the workers Sample Factory spawns (they import this module) get them too.
"""

import sys

import ale_py  # noqa: F401  (registers PongNoFrameskip-v4 and the other ALE ids)
from sf_examples.atari.train_atari import main

if __name__ == "__main__":
    sys.exit(main())
