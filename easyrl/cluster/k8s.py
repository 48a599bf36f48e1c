"""Kubernetes manifests for a config's cluster: `easyrl k8s CONFIG --image IMAGE`.

Made from the same config a local run uses (overrides included), one group per file:
- `configmap`: the config as the pods load it (`run.dir` on the pod's volume, no token
  file) and the cluster spec (`cluster.json`) naming every shard by its stable DNS name;
- `secret`: the auth token, only when a token file is given (else create the Secret
  `NAME-token` yourself, see `secret_command`); pods read it as EASYRL_TOKEN;
- `ps`, `memory`: StatefulSets behind headless Services. Shard i of role R is the pod
  `NAME-R-i`, reachable at `NAME-R-i.NAME-R.NAMESPACE.svc.DOMAIN:PORT`. It binds that same
  name: the kubelet writes it to the pod's /etc/hosts (hostname + subdomain), so it resolves
  to the pod's own IP at once, before any DNS record exists. A grpc readiness probe asks the
  standard health service, which says SERVING once the shard has restored its state. Each
  shard keeps `run.dir` (checkpoints, replay snapshots, metrics) on a volume of its own;
- `learner`, `actor`, `evaluator`: Indexed Jobs (`JOB_COMPLETION_INDEX` is the task
  index). A crashed worker is restarted (`restartPolicy: OnFailure`); one that saw the run
  stop exits 0 and completes its index. Workers wait `run.peer_timeout_s` for their servers.

Resources come from the config: CPUs from each role's thread budget (`cluster.threads`, given
to the process as EASYRL_THREADS) and, for actors and evaluators, their env subprocesses (with
`env.vector: async`, one per `env.envs_per_worker` envs), a memory shard's memory and disk
from its replay table, a GPU per learner with `learner.device: gpu`, a memory shard's
termination grace from the time its replay snapshot takes to write.

The examples under configs/k8s are regenerated with
`python -m easyrl.cluster.k8s --regenerate-examples`.
"""

import argparse
import base64
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from easyrl import config as config_lib
from easyrl.cluster.launcher import MALLOC_ENV
from easyrl.cluster.spec import ClusterSpec
from easyrl.cluster.threads import ROLE_THREADS, THREADS_ENV
from easyrl.errors import ConfigError
from easyrl.transport.rpc import TOKEN_ENV

PORTS = {"ps": 7000, "memory": 7100}
"""The port each listening role serves on (every pod has its own IP)."""
WORKER_ROLES = ("learner", "actor", "evaluator")
CONFIG_DIR = "/etc/easyrl"
"""Where the ConfigMap is mounted: config.yaml and cluster.json."""
RUN_DIR = "/var/easyrl/run"
"""The pods' `run.dir`: a volume (the shards' own persistent volume, else an emptyDir)."""
USER_ID = 1000
"""The uid the image runs as (see the Dockerfile); the pods' fsGroup, so volumes are writable."""
SECRET_KEY = "token"
"""The key of the token in the Secret."""
GIB = 2**30
BASE_MEMORY = {"ps": 2 * GIB, "memory": GIB, "learner": 4 * GIB, "actor": GIB, "evaluator": GIB}
"""Memory bytes a role's process needs besides its envs and replay table."""
LEARNER_THREADS = 2
"""A learner pod's thread budget (and CPUs) with `cluster.threads.learner` 0: a pod's
node and its cores are unknown here, so it is not derived from them."""
ENV_BYTES = GIB // 4
"""Memory of one environment subprocess (`env.vector: async`)."""
GRACE_S = 30
"""Seconds between SIGTERM and SIGKILL for any role: threads join (5 s each at most), a PS
shard writes its checkpoint (variables and optimizer slots), a server stops with 1 s grace."""
DISK_BYTES_PER_S = 50 * 2**20
"""The slowest volume write rate a memory shard's grace allows for its replay snapshot."""
BACKOFF_PER_TASK = 10
"""Restarts per task a worker Job allows before it fails."""
PROBE_TIMING = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3}
"""How often a shard's readiness probe asks its health service, and when it gives up."""
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
GROUPS = ("configmap", "secret", "ps", "memory", "learner", "actor", "evaluator")
"""The files `write` makes, in `kubectl apply` order."""
MAX_NAME = 40
"""Longest run name: pod names add `-evaluator-N` and hashes within 63 characters."""


@dataclass(frozen=True)
class Options:
    """How the manifests are made (besides the config).

    Args:
        image: the container image (built from the Dockerfile).
        name: prefix of every object's name (None: the config's `run.name`).
        namespace: the namespace every object goes to.
        token: the auth token to put in the Secret (None: no Secret; create it yourself).
        volume: "pvc" (a persistent volume per shard) or "emptydir" (lost with the pod).
        storage_class: the persistent volumes' storage class (None: the cluster's default).
        cluster_domain: the cluster's DNS domain (part of every shard's address).
    """

    image: str
    name: str | None = None
    namespace: str = "default"
    token: str | None = None
    volume: Literal["pvc", "emptydir"] = "pvc"
    storage_class: str | None = None
    cluster_domain: str = "cluster.local"

    def __post_init__(self):
        if not self.image or any(c.isspace() for c in self.image):
            raise ConfigError(f"k8s: --image must be an image reference, got {self.image!r}")
        if self.name is not None:
            check_name(self.name, "--name", MAX_NAME)
        check_name(self.namespace, "--namespace", 63)
        domains = {"--cluster-domain": self.cluster_domain, "--storage-class": self.storage_class}
        for what, value in domains.items():
            if value is not None and not _DOMAIN.fullmatch(value):
                raise ConfigError(f"k8s: {what} {value!r} is not a DNS name")
        if self.volume not in ("pvc", "emptydir"):
            raise ConfigError(f"k8s: --volume must be pvc or emptydir, got {self.volume!r}")
        if self.token is not None and (not self.token or self.token != self.token.strip()):
            raise ConfigError("k8s: the token must be non-empty, without surrounding spaces")


def check_name(value: str, what: str, longest: int) -> str:
    """Returns `value` when it is a DNS label (lowercase letters, digits and '-', starting
    with a letter, ending with a letter or digit) of at most `longest` characters.

    Raises:
        ConfigError: naming `what` and the rule.
    """
    if not _NAME.fullmatch(value) or len(value) > longest:
        raise ConfigError(
            f"k8s: {what} {value!r} must be at most {longest} lowercase letters, digits and "
            "'-', start with a letter and end with a letter or digit"
        )
    return value


def pod_config(cfg: config_lib.Config) -> config_lib.Config:
    """The config as the pods load it: `run.dir` on the pod's volume, no token file (the token
    comes from the Secret as EASYRL_TOKEN), authentication on.

    Raises:
        ConfigError: the config asks for TLS (certificate files are not mounted, and a
            kubelet's grpc probe speaks plaintext).
    """
    sec = cfg.security
    if sec.tls_cert or sec.tls_ca:
        raise ConfigError("k8s: security.tls_* is not supported in the generated manifests")
    run = replace(cfg.run, dir=RUN_DIR)
    return replace(cfg, run=run, security=replace(sec, token_file=None, insecure=False))


def cluster_spec(cfg: config_lib.Config, name: str, options: Options) -> ClusterSpec:
    """The cluster spec every pod gets: shard i of role R at its StatefulSet pod's DNS name."""

    def addresses(role: str) -> tuple[str, ...]:
        service = f"{name}-{role}"
        domain = f"{service}.{options.namespace}.svc.{options.cluster_domain}"
        count = getattr(cfg.cluster, role)
        return tuple(f"{service}-{i}.{domain}:{PORTS[role]}" for i in range(count))

    c = cfg.cluster
    if c.learner is None:  # config.load resolves it from the algorithm's flow
        raise ConfigError("cluster.learner: unresolved; load the config with easyrl.config.load")
    return ClusterSpec(
        ps=addresses("ps"),
        memory=addresses("memory"),
        learner=c.learner,
        actor=c.actor or 0,  # None: an offline run, no actors
        evaluator=c.evaluator,
    )


def replay_bytes(cfg: config_lib.Config) -> int:
    """Bytes of one memory shard's full replay table (`replay.capacity` items of the
    algorithm's columns; makes one environment to read its spaces). 0 without memory."""
    if not cfg.cluster.memory:
        return 0
    from easyrl.algorithms import registry
    from easyrl.envs.multiagent import run_spaces

    obs_space, action_space = run_spaces(cfg)
    spec = registry.replay_spec(cfg, obs_space, action_space)
    item = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in spec.values())
    return cfg.replay.capacity * item


def _mib(n: float) -> str:
    return f"{math.ceil(n / 2**20)}Mi"


def _object(api_version: str, kind: str, metadata: dict, **fields) -> dict:
    """A Kubernetes object: apiVersion, kind and metadata, then `fields` in order."""
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}


def thread_budget(cfg: config_lib.Config, role: str) -> int:
    """The thread budget of a role's pods (`easyrl.cluster.threads`), and so the CPUs each
    requests for it (a pod is alone on them): the config's `cluster.threads`, else the
    role's derived budget (`ROLE_THREADS`; LEARNER_THREADS for a learner)."""
    return getattr(cfg.cluster.threads, role) or ROLE_THREADS.get(role, LEARNER_THREADS)


def resources(cfg: config_lib.Config, role: str, replay: int) -> dict:
    """Requests and limits of a role's container (see the module docstring): a CPU per
    thread of its budget (`thread_budget`), besides its env subprocesses. Memory limits
    are twice the request: a memory shard copies its table to snapshot it."""
    cpu, memory = thread_budget(cfg, role), BASE_MEMORY[role]
    envs = {"actor": cfg.env.num_envs, "evaluator": cfg.eval.num_envs}.get(role, 0)
    if envs and cfg.env.vector == "async":  # a CPU per env subprocess
        workers = -(-envs // cfg.env.envs_per_worker)
        cpu, memory = cpu + workers, memory + envs * ENV_BYTES
    if role == "memory":
        memory += replay
    limits = {"memory": _mib(2 * memory)}
    if role == "learner" and cfg.learner.device == "gpu":
        limits["nvidia.com/gpu"] = "1"
    return {"requests": {"cpu": str(cpu), "memory": _mib(memory)}, "limits": limits}


def grace_s(cfg: config_lib.Config, role: str, replay: int) -> int:
    """terminationGracePeriodSeconds of a role: GRACE_S, plus, for a memory shard that
    snapshots its table on SIGTERM, the time to write it at DISK_BYTES_PER_S."""
    kind = cfg.replay.kind_spec
    if role == "memory" and kind is not None and kind.snapshots:
        return GRACE_S + math.ceil(replay / DISK_BYTES_PER_S)
    return GRACE_S


class _Builder:
    """Builds the manifests of one config (see `manifests`)."""

    def __init__(self, cfg: config_lib.Config, options: Options):
        self.cfg = cfg
        self.o = options
        self.name = options.name or check_name(cfg.run.name, "name (run.name; or --name)", MAX_NAME)
        self.replay = replay_bytes(cfg)

    def meta(self, suffix: str, role: str | None = None) -> dict:
        labels = {"app.kubernetes.io/name": "easyrl", "app.kubernetes.io/instance": self.name}
        if role:
            labels["app.kubernetes.io/component"] = role
        return {"name": f"{self.name}-{suffix}", "namespace": self.o.namespace, "labels": labels}

    def container(self, role: str, task: str) -> dict:
        token = {"secretKeyRef": {"name": f"{self.name}-token", "key": SECRET_KEY}}
        env = [
            {"name": TOKEN_ENV, "valueFrom": token},
            {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *({"name": k, "value": v} for k, v in MALLOC_ENV.items()),  # as the launcher's
            {"name": THREADS_ENV, "value": str(thread_budget(self.cfg, role))},
        ]
        if role != "learner":  # only learners compute on a GPU
            env.append({"name": "CUDA_VISIBLE_DEVICES", "value": "-1"})
        args = ["run", "--role", role, "--task", f"$({task})"]
        args += ["--config", f"{CONFIG_DIR}/config.yaml", "--cluster", f"{CONFIG_DIR}/cluster.json"]
        container = {
            "name": "easyrl",
            "image": self.o.image,
            "args": args,
            "env": env,
            "resources": resources(self.cfg, role, self.replay),
            "volumeMounts": [
                {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                {"name": "run", "mountPath": RUN_DIR},
            ],
            "securityContext": {"allowPrivilegeEscalation": False},
        }
        if role in PORTS:
            container["ports"] = [{"name": "grpc", "containerPort": PORTS[role]}]
            if self.cfg.run.prometheus_port is not None:  # each pod has its own name: one port
                metrics = {"name": "metrics", "containerPort": self.cfg.run.prometheus_port}
                container["ports"].append(metrics)
            container["readinessProbe"] = {"grpc": {"port": PORTS[role]}, **PROBE_TIMING}
        return container

    def pod(self, role: str, container: dict, restart: str, run_volume: dict | None) -> dict:
        volumes = [{"name": "config", "configMap": {"name": f"{self.name}-config"}}]
        if run_volume is not None:
            volumes.append({"name": "run", **run_volume})
        metadata: dict = {"labels": self.meta(role, role)["labels"]}
        scraped = self.cfg.run.prometheus_port
        if role in PORTS and scraped is not None:
            metadata["annotations"] = {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(scraped),
                "prometheus.io/path": "/metrics",
            }
        return {
            "metadata": metadata,
            "spec": {
                "restartPolicy": restart,
                "terminationGracePeriodSeconds": grace_s(self.cfg, role, self.replay),
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": USER_ID,
                    "runAsGroup": USER_ID,
                    "fsGroup": USER_ID,
                },
                "containers": [container],
                "volumes": volumes,
            },
        }

    def claim(self, storage: int) -> dict:
        spec = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{math.ceil(storage / GIB)}Gi"}},
        }
        if self.o.storage_class:
            spec["storageClassName"] = self.o.storage_class
        return spec

    def server(self, role: str) -> list[dict]:
        """Headless Service + StatefulSet of the PS or memory shards."""
        meta = self.meta(role, role)
        # The pod index label is set on StatefulSet pods since Kubernetes 1.28.
        container = self.container(role, "POD_INDEX")
        index = {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
        container["env"].insert(0, {"name": "POD_INDEX", "valueFrom": index})
        pvc = self.o.volume == "pvc"
        template = self.pod(role, container, "Always", None if pvc else {"emptyDir": {}})
        spec = {
            "serviceName": meta["name"],
            "replicas": getattr(self.cfg.cluster, role),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": meta["labels"]},
            "template": template,
        }
        if pvc:
            # A memory shard writes its snapshot next to the last one, then renames it; its
            # write-ahead log (checkpoints/memory-<i>.wal, beside them) holds the inserts
            # since the last snapshot: a table's worth allowed.
            tables = 2 + (self.cfg.replay.wal != "none")
            storage = tables * self.replay + GIB if role == "memory" else 2 * GIB
            claim = {"metadata": {"name": "run"}, "spec": self.claim(storage)}
            spec["volumeClaimTemplates"] = [claim]
        ports = [{"name": "grpc", "port": PORTS[role], "targetPort": "grpc"}]
        service = {"clusterIP": "None", "selector": meta["labels"], "ports": ports}
        return [
            _object("v1", "Service", meta, spec=service),
            _object("apps/v1", "StatefulSet", meta, spec=spec),
        ]

    def worker(self, role: str) -> list[dict]:
        """Indexed Job of a worker role (+ the evaluator's volume for checkpoints/best.npz)."""
        count = getattr(self.cfg.cluster, role)
        docs, run_volume = [], {"emptyDir": {}}
        if role == "evaluator" and self.o.volume == "pvc":
            claim = self.claim(GIB)
            docs.append(_object("v1", "PersistentVolumeClaim", self.meta(role, role), spec=claim))
            run_volume = {"persistentVolumeClaim": {"claimName": f"{self.name}-{role}"}}
        container = self.container(role, "JOB_COMPLETION_INDEX")
        job = {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimit": BACKOFF_PER_TASK * count,
            "template": self.pod(role, container, "OnFailure", run_volume),
        }
        return [*docs, _object("batch/v1", "Job", self.meta(role, role), spec=job)]

    def build(self) -> dict[str, list[dict]]:
        spec = cluster_spec(self.cfg, self.name, self.o)
        data = {
            "config.yaml": config_lib.dump(pod_config(self.cfg)),
            "cluster.json": json.dumps(asdict(spec), indent=2) + "\n",
        }
        groups = {"configmap": [_object("v1", "ConfigMap", self.meta("config"), data=data)]}
        if self.o.token is not None:
            token = {SECRET_KEY: base64.b64encode(self.o.token.encode()).decode()}
            secret = _object("v1", "Secret", self.meta("token"), type="Opaque", data=token)
            groups["secret"] = [secret]
        for role in ("ps", "memory", *WORKER_ROLES):
            if getattr(self.cfg.cluster, role):
                groups[role] = self.server(role) if role in PORTS else self.worker(role)
        return groups


def manifests(cfg: config_lib.Config, options: Options) -> dict[str, list[dict]]:
    """The manifests of `cfg`'s cluster, as {file stem: documents}: configmap, secret (with
    a token), ps, memory, learner, actor, evaluator (the roles the config has).

    Raises:
        ConfigError: a bad name, namespace or image, or a config the manifests cannot run.
    """
    return _Builder(cfg, options).build()


def secret_command(name: str, namespace: str) -> str:
    """The kubectl command that creates the token Secret the manifests expect."""
    return (
        f"kubectl -n {namespace} create secret generic {name}-token "
        f'--from-literal={SECRET_KEY}="$(openssl rand -hex 16)"'
    )


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (the ConfigMap's files) as literal blocks, and shared
    objects (labels) in full rather than as YAML aliases."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render(docs: list[dict]) -> str:
    """The documents as one multi-document YAML text."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def write(groups: dict[str, list[dict]], out_dir: str | Path) -> list[Path]:
    """Writes each group to `out_dir/<stem>.yaml` (for `kubectl apply -f out_dir`); removes
    the files of groups (see GROUPS) this config no longer has. Returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stem in GROUPS:
        if stem not in groups:
            (out / f"{stem}.yaml").unlink(missing_ok=True)
    paths = [out / f"{stem}.yaml" for stem in groups]
    for path, docs in zip(paths, groups.values()):
        path.write_text(render(docs))
    return paths


ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "configs" / "k8s"
EXAMPLE_IMAGE = "easyrl:0.1.0-gpu"
"""The image the examples name (`docker build --build-arg VARIANT=gpu -t easyrl:0.1.0-gpu .`)."""
EXAMPLES = {
    "pong-apex": (
        "pong_apex.yaml",
        (
            "cluster.actor=32",
            "cluster.memory=4",
            "cluster.learner=2",
            "cluster.ps=2",
            "learner.device=gpu",
        ),
    ),
    "pong-impala": ("pong_impala.yaml", ()),
}
"""Example directory -> (config under configs/, overrides)."""


def example(name: str) -> dict[str, list[dict]]:
    """The manifests of example `name` (see EXAMPLES)."""
    config, overrides = EXAMPLES[name]
    cfg = config_lib.load(ROOT / "configs" / config, overrides)
    return manifests(cfg, Options(image=EXAMPLE_IMAGE))


def regenerate_examples(out_dir: Path = EXAMPLES_DIR) -> list[Path]:
    """Writes every example to `out_dir/<name>/`; returns the written paths."""
    return [path for name in EXAMPLES for path in write(example(name), out_dir / name)]


def main(argv=None) -> int:
    """`python -m easyrl.cluster.k8s --regenerate-examples`."""
    parser = argparse.ArgumentParser(prog="python -m easyrl.cluster.k8s", description=__doc__)
    parser.add_argument(
        "--regenerate-examples",
        action="store_true",
        required=True,
        help=f"rewrite the example manifests under {EXAMPLES_DIR.relative_to(ROOT)}",
    )
    parser.parse_args(argv)
    for path in regenerate_examples():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
