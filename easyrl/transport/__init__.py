"""easyrl.transport."""
