"""What `agent.py` needs of my_algo's numpy side: `Params` and the flow. It is its own module
so that `agent.py` never imports the package (whose `build` imports `agent.py`): easyrl's own
algorithms are laid out the same way, and its tests refuse import circles in them.
"""

from dataclasses import dataclass

FLOW = "async_replay"
"""The flow: actors ship transitions; learners sample them asynchronously."""


@dataclass(frozen=True)
class Params:
    """Hyper-parameters (the config's `algorithm` keys next to `name`)."""

    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 64
    """Transitions per learner batch (read by the runtime)."""
    max_staleness: int = 20
    """PS shards drop gradients older than this many updates (read by the runtime)."""
    lr: float = 1e-3
    """Adam learning rate."""
    target_update_period: int = 100
    """Learner updates between target-network syncs."""
    epsilon: float = 0.1
    """Exploration rate of every actor."""
