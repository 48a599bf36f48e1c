"""easyrl.roles."""
