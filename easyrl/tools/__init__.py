"""Everyday tools on a run directory, for the command line (`easyrl rollout | export |
plot`) and for Python, each a function of plain arguments in the module of its name:

    from easyrl.tools.export import export
    from easyrl.tools.plot import plot
    from easyrl.tools.rollout import rollout

    rollout("runs/cartpole-apex-20261122-010758", episodes=5)
    export("runs/cartpole-apex-20261122-010758", "exported/cartpole")
    plot(["runs/a", "runs/b"], "curve.png")

The functions are not re-exported here: `easyrl.tools.rollout` would then name the function
instead of its module. TensorFlow is imported only by the functions that need it.
"""
