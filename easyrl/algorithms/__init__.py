"""easyrl.algorithms."""
