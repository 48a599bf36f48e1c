"""easyrl: distributed reinforcement learning on TensorFlow 2 and gRPC."""

__version__ = "0.1.0"
