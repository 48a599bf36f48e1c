"""easyrl.cluster."""
