"""The `easyrl` command: `train` (whole cluster locally), `run` (one role process), `sweep`
(a grid of settings x seeds, one run each), `k8s` (Kubernetes manifests), and the tools on
a run directory: `rollout` (play its policy), `export` (SavedModel), `plot`."""

import argparse
import gc
import logging
import sys
from pathlib import Path

from easyrl import __version__
from easyrl import config as config_lib
from easyrl.errors import EasyRLError
from easyrl.tfimport import import_tensorflow_quietly

ROLES = ("ps", "memory", "learner", "actor", "evaluator")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="easyrl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"easyrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_common(p):
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value, e.g. --set replay.capacity=100000 (repeatable)",
        )

    def add_grid(p, grid_help: str):
        p.add_argument(
            "--grid", action="append", default=[], metavar="KEY=V1,V2,...", help=grid_help
        )
        p.add_argument(
            "--seeds", type=int, default=1, metavar="N", help="seeds per setting (run.seed 0..N-1)"
        )

    train = sub.add_parser("train", help="train with every role as a local process")
    train.add_argument("config", nargs="?", help="YAML config file (not with --resume)")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="go on with an interrupted run from its checkpoints"
    )
    add_common(train)

    run = sub.add_parser("run", help="run one process of one role")
    run.add_argument("--role", required=True, choices=ROLES)
    run.add_argument("--task", type=int, default=0, help="index within the role")
    run.add_argument("--config", required=True, help="YAML config file")
    run.add_argument("--cluster", help="cluster file (YAML/JSON); else flags or EASYRL_CLUSTER")
    run.add_argument("--ps-hosts", help="comma-separated host:port of the PS shards")
    run.add_argument("--memory-hosts", help="comma-separated host:port of the memory shards")
    run.add_argument("--num-learners", type=int)
    run.add_argument("--num-actors", type=int)
    run.add_argument("--num-evaluators", type=int)
    add_common(run)

    checkpoint_help = "which weights: best (default when checkpoints/best.npz exists) or latest"
    rollout = sub.add_parser("rollout", help="play a run's greedy policy for whole episodes")
    rollout.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    rollout.add_argument(
        "--episodes", type=int, default=10, metavar="N", help="episodes to play (default 10)"
    )
    rollout.add_argument("--checkpoint", choices=("best", "latest"), help=checkpoint_help)
    rollout.add_argument("--video", metavar="DIR", help="record every episode into DIR")
    rollout.add_argument("--seed", type=int, metavar="S", help="seed of the first reset")

    export = sub.add_parser("export", help="save a run's greedy policy as a SavedModel")
    export.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    export.add_argument("--out", required=True, metavar="DIR", help="the SavedModel directory")
    export.add_argument("--checkpoint", choices=("best", "latest"), help=checkpoint_help)

    sweep = sub.add_parser("sweep", help="train a grid of settings x seeds, one run each")
    sweep.add_argument("config", help="YAML config file")
    add_grid(sweep, "a config key and the values to try (repeatable: the cross product is run)")
    sweep.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="K",
        help="trials at a time (the cores are split)",
    )
    sweep.add_argument(
        "--dir", metavar="DIR", help="sweep directory (default: runs/<run.name>-sweep-<hash>)"
    )
    sweep.add_argument(
        "--early-stop",
        choices=("median",),
        help="stop a trial whose best return is below the finished trials' median at the same time",
    )
    sweep.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a trial trains before --early-stop may stop it",
    )
    add_common(sweep)

    k8s = sub.add_parser("k8s", help="Kubernetes manifests for a config's cluster")
    k8s.add_argument("config", help="YAML config file")
    k8s.add_argument("--image", required=True, help="container image (see the Dockerfile)")
    k8s.add_argument("--namespace", default="default", help="namespace (default: default)")
    k8s.add_argument("--name", help="prefix of the objects' names (default: run.name)")
    k8s.add_argument("--out", metavar="DIR", help="write one file per role into DIR")
    k8s.add_argument("--token-file", metavar="FILE", help="put this token in a Secret")
    k8s.add_argument(
        "--volume",
        choices=("pvc", "emptydir"),
        default="pvc",
        help="run directory of the shards: a persistent volume each (default) or emptyDir",
    )
    k8s.add_argument("--storage-class", help="storage class of the persistent volumes")
    k8s.add_argument("--cluster-domain", default="cluster.local", help="the cluster's DNS domain")
    add_grid(k8s, "render a sweep (as `easyrl sweep`): one set of manifests per trial under --out")
    add_common(k8s)

    plot = sub.add_parser("plot", help="learning curves of runs from their metrics.jsonl")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    plot.add_argument("--out", required=True, metavar="FILE", help="the image, e.g. curve.png")
    return parser


def _cluster_from_args(args, cfg):
    from easyrl.cluster.spec import ClusterSpec

    flags = ("ps_hosts", "memory_hosts", "num_learners", "num_actors", "num_evaluators")
    if args.cluster:
        return ClusterSpec.from_file(args.cluster)
    if any(getattr(args, flag) is not None for flag in flags):
        raw = {
            "ps": args.ps_hosts or "",
            "memory": args.memory_hosts or "",
            "learner": args.num_learners if args.num_learners is not None else 1,
            "actor": args.num_actors if args.num_actors is not None else 1,
            "evaluator": args.num_evaluators or 0,
        }
        return ClusterSpec.from_mapping(raw)
    spec = ClusterSpec.from_env()
    if spec is None:
        raise EasyRLError(
            "no cluster given: use --cluster FILE, --ps-hosts/--memory-hosts/--num-learners/"
            "--num-actors/--num-evaluators, or the EASYRL_CLUSTER environment variable"
        )
    return spec


def run_role(args) -> int:
    """`easyrl run`: one process of one role."""
    from importlib import import_module

    from easyrl.roles.common import RoleContext, apply_thread_budget
    from easyrl.transport.rpc import resolve_token

    cfg = config_lib.load(args.config, args.overrides)
    if cfg.run.deterministic and args.role != "memory":  # a memory shard runs no TensorFlow
        from easyrl.seeds import make_deterministic

        make_deterministic(cfg.run.seed)
    cluster = _cluster_from_args(args, cfg)
    limit = {"ps": len(cluster.ps), "memory": len(cluster.memory)}.get(args.role)
    limit = limit or getattr(cluster, args.role)
    if not 0 <= args.task < limit:
        raise EasyRLError(f"--task {args.task} out of range for {limit} {args.role} process(es)")
    token = resolve_token(cfg.security.token_file, cfg.security.insecure)
    run_dir = Path(cfg.run.dir or Path("runs") / cfg.run.name)
    if args.role != "memory":  # a memory shard never uses TensorFlow (seconds of CPU less)
        import_tensorflow_quietly()
    ctx = RoleContext(cfg=cfg, task=args.task, cluster=cluster, token=token, run_dir=run_dir)
    apply_thread_budget(args.role, cfg)
    try:
        return import_module(f"easyrl.roles.{args.role}").run(ctx)
    finally:
        ctx.close_clients()


def k8s_cmd(args) -> int:
    """`easyrl k8s`: prints the manifests of a config's cluster, or writes them to a folder."""
    from easyrl.cluster import k8s
    from easyrl.transport.rpc import read_token_file

    token = read_token_file(args.token_file, "k8s") if args.token_file else None
    flags = ("image", "name", "namespace", "volume", "storage_class", "cluster_domain")
    options = k8s.Options(token=token, **{flag: getattr(args, flag) for flag in flags})
    cfg = config_lib.load(args.config, args.overrides)
    if args.grid:
        return _k8s_sweep(args, cfg, options)
    groups = k8s.manifests(cfg, options)
    if args.out:
        for path in k8s.write(groups, args.out):
            print(f"wrote {path}", file=sys.stderr)
    else:
        print(k8s.render([doc for docs in groups.values() for doc in docs]), end="")
    if token is None:
        print(
            "no --token-file: create the token Secret first:\n  "
            + k8s.secret_command(args.name or cfg.run.name, args.namespace),
            file=sys.stderr,
        )
    return 0


def _k8s_sweep(args, cfg, options) -> int:
    """`easyrl k8s --grid ...`: the manifests of every trial of a sweep, each under
    `--out/<trial>/` with its objects named `<name>-t<index>` (listed in `trials.csv`)."""
    from dataclasses import replace

    from easyrl.cluster import k8s
    from easyrl.tools.sweep import make_trials, parse_grid

    if not args.out:
        raise EasyRLError("k8s --grid writes one folder per trial: give --out DIR")
    trials = make_trials(parse_grid(args.grid), args.seeds)
    base = args.name or cfg.run.name
    out, lines = Path(args.out), ["trial,name,overrides"]
    for index, trial in enumerate(trials):
        sets = trial.settings
        name = k8s.check_name(f"{base}-t{index}", "trial name (--name or run.name)", k8s.MAX_NAME)
        groups = k8s.manifests(
            config_lib.load(args.config, [*args.overrides, *sets]), replace(options, name=name)
        )
        for path in k8s.write(groups, out / trial.name):
            print(f"wrote {path}", file=sys.stderr)
        lines.append(f'{trial.name},{name},"{" ".join(sets)}"')
    (out / "trials.csv").write_text("\n".join(lines) + "\n")
    if options.token is None:
        names = " ".join(f"{base}-t{i}" for i in range(len(trials)))
        print(
            f"no --token-file: create each trial's token Secret first ({names}), e.g.:\n  "
            + k8s.secret_command(f"{base}-t0", args.namespace),
            file=sys.stderr,
        )
    return 0


def rollout_cmd(args) -> int:
    """`easyrl rollout`: plays a run's greedy policy, one line per episode and the mean."""
    from easyrl.tools.rollout import rollout

    rollout(args.run_dir, args.episodes, args.checkpoint, args.video, args.seed)
    return 0


def export_cmd(args) -> int:
    """`easyrl export`: writes a run's greedy policy as a SavedModel."""
    from easyrl.tools.export import export

    out = export(args.run_dir, args.out, args.checkpoint)
    print(f"saved the policy to {out} (signature 'action': obs -> action)")
    return 0


def plot_cmd(args) -> int:
    """`easyrl plot`: draws the learning curves of runs into an image."""
    from easyrl.tools.plot import plot

    print(f"wrote {plot(args.run_dirs, args.out)}")
    return 0


TOOLS = {"rollout": rollout_cmd, "export": export_cmd, "plot": plot_cmd}
"""The sub-commands that work on a run directory, by name."""


def main(argv=None) -> int:
    """Entry point of the `easyrl` console script."""
    args = _parser().parse_args(argv)
    from easyrl.cluster.launcher import adopt_start_env

    adopt_start_env()  # started by a launcher or a sweep: its cores, dying with it
    # TensorFlow is imported (quietly: easyrl.tfimport) only once the inputs are checked,
    # by what needs it: `easyrl.train`, the tools, a role process other than a memory shard.
    role = f"{args.role}-{args.task}" if args.command == "run" else "launcher"
    if args.command in TOOLS:
        role = args.command
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        if args.command == "train":
            from easyrl.api import train

            if (args.config is None) == (args.resume is None):
                raise EasyRLError("train: give a CONFIG file, or --resume RUN_DIR (not both)")
            result = train(args.config, resume=args.resume, out=sys.stdout, set=args.overrides)
            return result.exit_code
        if args.command == "sweep":
            from easyrl.tools.sweep import sweep

            return sweep(
                args.config,
                args.grid,
                seeds=args.seeds,
                parallel=args.parallel,
                sets=args.overrides,
                directory=args.dir,
                early_stop=args.early_stop,
                grace_s=args.grace_s,
            )
        if args.command in TOOLS:
            return TOOLS[args.command](args)
        if args.command == "k8s":
            return k8s_cmd(args)
        return run_role(args)
    except EasyRLError as err:
        print(f"easyrl: error: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """The `easyrl` console script and `python -m easyrl.cli`: `main`, then the exit, without
    a last garbage collection over everything the process holds (`gc.freeze`): with
    TensorFlow imported, exiting took ~0.6 CPU-seconds, ~0.1 without it (every role process
    and the launcher; a local run waits for its PS shards' exits, then its own)."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
