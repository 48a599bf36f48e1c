"""Tests of easyrl.cluster.k8s and `easyrl k8s`: every manifest validated offline against the
Kubernetes schemas, the cluster wiring (addresses, Services, task indices, token, config),
resources from the config, the committed examples, and the Dockerfile they run."""

import base64
import copy
import json
import re
from collections import defaultdict
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from easyrl import cli
from easyrl import config as config_lib
from easyrl.cluster import k8s
from easyrl.cluster.launcher import MALLOC_ENV
from easyrl.cluster.spec import ClusterSpec
from easyrl.errors import ConfigError
from easyrl.transport.rpc import TOKEN_ENV

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.30"
"""The Kubernetes version the manifests are validated against (fixed: offline schemas)."""
TOKEN = "k8s-test-token-0123456789abcdef"
IMAGE = "registry.example/easyrl:test"


def load(name: str, *overrides: str) -> config_lib.Config:
    return config_lib.load(ROOT / "configs" / name, overrides)


def documents(groups: dict[str, list[dict]]) -> list[dict]:
    return [doc for docs in groups.values() for doc in docs]


def by_kind(groups) -> dict[str, dict[str, dict]]:
    out = defaultdict(dict)
    for doc in documents(groups):
        name = doc["metadata"]["name"]
        assert name not in out[doc["kind"]], f"two {doc['kind']}s named {name}"
        out[doc["kind"]][name] = doc
    return out


def pod_specs(groups) -> list[tuple[str, dict]]:
    """(workload name, pod spec) of every StatefulSet and Job."""
    kinds = by_kind(groups)
    return [
        (name, doc["spec"]["template"]["spec"])
        for kind in ("StatefulSet", "Job")
        for name, doc in kinds[kind].items()
    ]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def strings(value):
    """Every string in a nested document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


# Configs and options covering every shape: the two examples, a token Secret, emptyDir
# volumes, an evaluator, actor gradients (no memory, no learner), another namespace.
CASES = {
    "pong-apex": ("pong_apex.yaml", k8s.EXAMPLES["pong-apex"][1], {}),
    "pong-impala": ("pong_impala.yaml", (), {}),
    "token-emptydir": (
        "cartpole_apex.yaml",
        (),
        {"token": TOKEN, "volume": "emptydir", "namespace": "rl", "name": "cp"},
    ),
    "evaluator": ("pendulum_sac.yaml", ("cluster.evaluator=1",), {"storage_class": "fast"}),
    "a3c": ("cartpole_a3c.yaml", (), {"token": TOKEN}),
    "ppo-gpu": ("cartpole_ppo.yaml", ("learner.device=gpu",), {"cluster_domain": "k8s.local"}),
    "prometheus": ("pong_apex.yaml", ("run.prometheus_port=9100", "cluster.ps=2"), {}),
    "threads": (
        "pendulum_sac.yaml",
        ("cluster.evaluator=1", "cluster.threads.learner=6", "cluster.threads.ps=3"),
        {},
    ),
}


@pytest.fixture(scope="module")
def generated() -> dict[str, tuple[config_lib.Config, k8s.Options, dict]]:
    out = {}
    for case, (config, overrides, options) in CASES.items():
        cfg = load(config, *overrides)
        opts = k8s.Options(image=IMAGE, **options)
        out[case] = (cfg, opts, k8s.manifests(cfg, opts))
    return out


def test_examples_are_current(tmp_path):
    k8s.regenerate_examples(tmp_path)
    fresh = {p.relative_to(tmp_path): p.read_text() for p in sorted(tmp_path.rglob("*.yaml"))}
    committed = {
        p.relative_to(k8s.EXAMPLES_DIR): p.read_text()
        for p in sorted(k8s.EXAMPLES_DIR.rglob("*.yaml"))
    }
    hint = "configs/k8s is stale: run python -m easyrl.cluster.k8s --regenerate-examples"
    assert sorted(fresh) == sorted(committed), hint
    for path, text in fresh.items():
        assert committed[path] == text, f"{path}: {hint}"


def test_examples_have_the_asked_cluster_shapes():
    apex = by_kind(k8s.example("pong-apex"))
    assert apex["StatefulSet"]["pong-apex-ps"]["spec"]["replicas"] == 2
    assert apex["StatefulSet"]["pong-apex-memory"]["spec"]["replicas"] == 4
    assert apex["Job"]["pong-apex-learner"]["spec"]["completions"] == 2
    assert apex["Job"]["pong-apex-actor"]["spec"]["completions"] == 32
    impala = by_kind(k8s.example("pong-impala"))
    config = yaml.safe_load(impala["ConfigMap"]["pong-impala-config"]["data"]["config.yaml"])
    assert config["algorithm"]["name"] == "impala"


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_validates_against_the_kubernetes_schemas(generated, case):
    _, _, groups = generated[case]
    for doc in documents(groups):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest(generated):
    _, _, groups = generated["pong-apex"]
    job = copy.deepcopy(by_kind(groups)["Job"]["pong-apex-actor"])
    job["spec"]["completion"] = job["spec"].pop("completions")  # a misspelled field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    sts = copy.deepcopy(by_kind(groups)["StatefulSet"]["pong-apex-ps"])
    sts["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


@pytest.mark.parametrize("case", CASES)
def test_every_peer_address_is_a_pod_of_a_headless_service(generated, case):
    cfg, opts, groups = generated[case]
    kinds = by_kind(groups)
    assert {doc["metadata"]["namespace"] for doc in documents(groups)} == {opts.namespace}
    (configmap,) = kinds["ConfigMap"].values()
    spec = ClusterSpec.from_mapping(json.loads(configmap["data"]["cluster.json"]))
    for role, port in k8s.PORTS.items():
        addresses = getattr(spec, role)
        assert len(addresses) == getattr(cfg.cluster, role)
        sets = [s for n, s in kinds["StatefulSet"].items() if n.endswith(f"-{role}")]
        assert len(sets) == (1 if addresses else 0)
        indices = []
        for address in addresses:
            host, _, address_port = address.rpartition(":")
            pod, service, namespace, svc, domain = host.split(".", 4)
            assert (namespace, svc, domain) == (opts.namespace, "svc", opts.cluster_domain)
            # The Service exists, is headless, and selects the StatefulSet whose pods it names.
            svc_doc = kinds["Service"][service]
            assert svc_doc["spec"]["clusterIP"] == "None"
            (sts,) = sets
            assert sts["spec"]["serviceName"] == service
            labels = sts["spec"]["template"]["metadata"]["labels"]
            assert svc_doc["spec"]["selector"].items() <= labels.items()
            assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
            match = re.fullmatch(rf"{re.escape(sts['metadata']['name'])}-(\d+)", pod)
            assert match, f"{pod} is not a pod of StatefulSet {sts['metadata']['name']}"
            indices.append(int(match.group(1)))
            # The port: served by the container, published by the Service, probed.
            (container,) = sts["spec"]["template"]["spec"]["containers"]
            container_port = container["ports"][0]  # then "metrics" where Prometheus is on
            (svc_port,) = svc_doc["spec"]["ports"]
            assert container_port == {"name": "grpc", "containerPort": int(address_port)}
            assert svc_port["port"] == int(address_port)
            assert svc_port["targetPort"] == "grpc"
            assert container["readinessProbe"]["grpc"] == {"port": int(address_port)}
            assert int(address_port) == port
        if addresses:
            # Shard i is pod i: ordinals 0..replicas-1, each an address once, each its --task.
            assert sorted(indices) == list(range(sts["spec"]["replicas"]))
            assert arg(container, "--role") == role
            assert arg(container, "--task") == "$(POD_INDEX)"
            field = env_of(container)["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "metadata.labels['apps.kubernetes.io/pod-index']"
            assert sts["spec"]["podManagementPolicy"] == "Parallel"
            assert sts["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    for role in k8s.WORKER_ROLES:
        count = getattr(spec, role)
        assert count == getattr(cfg.cluster, role)
        job = kinds["Job"].get(f"{k8s_name(cfg, opts)}-{role}")
        if not count:
            assert job is None
            continue
        # Indexed: the Job runs indices 0..completions-1 once each, all at once.
        assert job["spec"]["completionMode"] == "Indexed"
        assert job["spec"]["completions"] == job["spec"]["parallelism"] == count
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "OnFailure"  # a crashed worker is restarted
        (container,) = pod["containers"]
        assert arg(container, "--role") == role
        assert arg(container, "--task") == "$(JOB_COMPLETION_INDEX)"
        assert "readinessProbe" not in container and "ports" not in container
    # Nothing is pointed at this machine: every address any pod gets is a Service DNS name.
    for text in strings({k: v for k, v in configmap["data"].items() if k != "config.yaml"}):
        assert not re.search(r"localhost|127\.0\.0\.|0\.0\.0\.0", text)
    for _, pod in pod_specs(groups):
        for text in strings(pod):
            assert not re.search(r"localhost|127\.0\.0\.|0\.0\.0\.0", text)


def k8s_name(cfg, opts) -> str:
    return opts.name or cfg.run.name


@pytest.mark.parametrize("case", CASES)
def test_every_pod_loads_the_configmap_and_takes_the_token_from_the_secret(generated, case):
    cfg, opts, groups = generated[case]
    kinds = by_kind(groups)
    name = k8s_name(cfg, opts)
    (configmap,) = kinds["ConfigMap"].values()
    secret_name = f"{name}-token"
    if opts.token is None:
        assert "Secret" not in kinds  # made with kubectl, never written to a file
    else:
        secret = kinds["Secret"][secret_name]
        assert base64.b64decode(secret["data"][k8s.SECRET_KEY]).decode() == opts.token
        # The token is in the Secret and nowhere else.
        others = [doc for doc in documents(groups) if doc is not secret]
        assert not any(opts.token in text for text in strings(others))
    for workload, pod in pod_specs(groups):
        (container,) = pod["containers"]
        token = env_of(container)[TOKEN_ENV]
        ref = {"secretKeyRef": {"name": secret_name, "key": k8s.SECRET_KEY}}
        assert token == {"name": TOKEN_ENV, "valueFrom": ref}, workload
        assert not any("token" in a.lower() for a in container["args"]), workload
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert arg(container, "--config") == f"{mounts['config']}/config.yaml"
        assert arg(container, "--cluster") == f"{mounts['config']}/cluster.json"
        assert mounts["run"] == k8s.RUN_DIR
        assert container["image"] == IMAGE and "command" not in container
        assert container["args"][0] == "run"  # the image's entrypoint is `easyrl`
    text = configmap["data"]["config.yaml"]
    assert "token_file: null" in text and "insecure: false" in text


@pytest.mark.parametrize("case", CASES)
def test_config_and_cluster_round_trip_through_the_configmap(generated, case, tmp_path):
    cfg, opts, groups = generated[case]
    (configmap,) = by_kind(groups)["ConfigMap"].values()
    (tmp_path / "config.yaml").write_text(configmap["data"]["config.yaml"])
    (tmp_path / "cluster.json").write_text(configmap["data"]["cluster.json"])
    loaded = config_lib.load(tmp_path / "config.yaml")
    assert loaded == k8s.pod_config(cfg)
    assert loaded.run.dir == k8s.RUN_DIR
    assert loaded.security.token_file is None and not loaded.security.insecure
    assert loaded.algorithm == cfg.algorithm and loaded.cluster == cfg.cluster
    # What `easyrl run --cluster /etc/easyrl/cluster.json` reads.
    spec = ClusterSpec.from_file(tmp_path / "cluster.json")
    assert spec == k8s.cluster_spec(cfg, k8s_name(cfg, opts), opts)


@pytest.mark.parametrize("case", CASES)
def test_shards_keep_their_run_dir_on_a_volume(generated, case):
    _, opts, groups = generated[case]
    kinds = by_kind(groups)
    for sts in kinds["StatefulSet"].values():
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        if opts.volume == "pvc":
            (claim,) = sts["spec"]["volumeClaimTemplates"]
            assert claim["metadata"]["name"] == "run" and "run" not in volumes
            assert claim["spec"].get("storageClassName") == opts.storage_class
        else:
            assert "volumeClaimTemplates" not in sts["spec"]
            assert volumes["run"] == {"name": "run", "emptyDir": {}}
    evaluator = kinds["Job"].get(f"{k8s_name(*generated[case][:2])}-evaluator")
    if evaluator is not None:
        volumes = {v["name"]: v for v in evaluator["spec"]["template"]["spec"]["volumes"]}
        claim = volumes["run"]["persistentVolumeClaim"]["claimName"]
        assert claim in kinds["PersistentVolumeClaim"]  # checkpoints/best.npz survives


def test_a_memory_shards_log_lives_on_its_volume_beside_its_snapshots(generated):
    from easyrl.roles import memory, wal

    cfg, _, groups = generated["pong-apex"]
    sts = by_kind(groups)["StatefulSet"]["pong-apex-memory"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "run"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "run" and mount["mountPath"] == k8s.RUN_DIR
    run_dir = Path(k8s.pod_config(cfg).run.dir or "")
    snapshot = memory.snapshot_path(run_dir, 3)
    log = wal.log_dir(snapshot)
    assert log.parent == snapshot.parent and log.is_relative_to(k8s.RUN_DIR)
    # The claim holds the snapshot, the one replacing it and a table's worth of log.
    storage = quantity(claim["spec"]["resources"]["requests"]["storage"])
    without = k8s.manifests(load("pong_apex.yaml", "replay.wal=none"), k8s.Options(image=IMAGE))
    (small,) = by_kind(without)["StatefulSet"]["pong-apex-memory"]["spec"]["volumeClaimTemplates"]
    replay = k8s.replay_bytes(cfg)
    assert storage >= 3 * replay and storage - replay == pytest.approx(
        quantity(small["spec"]["resources"]["requests"]["storage"]), abs=2**30
    )


def quantity(text: str) -> int:
    units = {"Mi": 2**20, "Gi": 2**30}
    return int(text[:-2]) * units[text[-2:]]


def memory_container(groups, name):
    return by_kind(groups)["StatefulSet"][f"{name}-memory"]["spec"]["template"]["spec"]


def test_resources_and_grace_follow_the_config():
    opts = k8s.Options(image=IMAGE)
    small = k8s.manifests(load("pong_apex.yaml", "replay.capacity=50000"), opts)
    large = k8s.manifests(load("pong_apex.yaml", "replay.capacity=150000"), opts)
    # One Pong transition: obs and next_obs (84x84x4 uint8 frames), int64 action, float32
    # reward and discount.
    item = 2 * 84 * 84 * 4 + 8 + 4 + 4
    pods = [memory_container(g, "pong-apex") for g in (small, large)]
    requests = [quantity(p["containers"][0]["resources"]["requests"]["memory"]) for p in pods]
    assert requests[0] >= 50000 * item
    assert requests[1] - requests[0] == pytest.approx(100000 * item, abs=2**20)
    # SIGTERM makes a memory shard write its snapshot: more items, more grace.
    graces = [p["terminationGracePeriodSeconds"] for p in pods]
    assert graces[1] - graces[0] == pytest.approx(100000 * item / k8s.DISK_BYTES_PER_S, abs=1)
    (claim,) = by_kind(large)["StatefulSet"]["pong-apex-memory"]["spec"]["volumeClaimTemplates"]
    storage = quantity(claim["spec"]["resources"]["requests"]["storage"])
    assert storage >= 2 * 150000 * item  # the snapshot and the one it replaces
    # Actors: a CPU per env subprocess (async: one per env_per_worker envs) besides the main
    # loop; one with sync envs.
    for vector, envs, per_worker, cpus in (
        ("async", 4, 1, 5),
        ("async", 8, 4, 3),
        ("async", 5, 2, 4),
        ("sync", 6, 1, 1),
    ):
        sets = (f"env.vector={vector}", f"env.num_envs={envs}", f"env.envs_per_worker={per_worker}")
        cfg = load("pong_apex.yaml", *sets)
        actor = by_kind(k8s.manifests(cfg, opts))["Job"]["pong-apex-actor"]
        resources = actor["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"]["cpu"] == str(cpus)


@pytest.mark.parametrize("case", CASES)
def test_cpu_requests_match_each_roles_thread_budget(generated, case):
    """Each pod requests a CPU per thread of its role's budget, plus one per env subprocess,
    and its process gets that budget (EASYRL_THREADS): the config's `cluster.threads`, else
    1, and 2 for a learner."""
    cfg, _, groups = generated[case]
    configured = cfg.cluster.threads
    for workload, pod in pod_specs(groups):
        role = workload.rsplit("-", 1)[1]
        budget = getattr(configured, role) or (2 if role == "learner" else 1)
        (container,) = pod["containers"]
        assert env_of(container)["EASYRL_THREADS"]["value"] == str(budget), workload
        envs = {"actor": cfg.env.num_envs, "evaluator": cfg.eval.num_envs}.get(role, 0)
        subprocesses = -(-envs // cfg.env.envs_per_worker) if cfg.env.vector == "async" else 0
        assert container["resources"]["requests"]["cpu"] == str(budget + subprocesses), workload
    if case == "threads":
        jobs = by_kind(groups)["Job"]
        learner = jobs["pendulum-sac-learner"]["spec"]["template"]["spec"]["containers"][0]
        assert learner["resources"]["requests"]["cpu"] == "6"


def test_server_pods_expose_prometheus_when_the_config_asks(generated):
    for case in ("prometheus", "pong-apex"):
        cfg, _, groups = generated[case]
        asked = cfg.run.prometheus_port is not None
        for kind in ("StatefulSet", "Job"):
            for name, doc in by_kind(groups)[kind].items():
                template = doc["spec"]["template"]
                ports = {
                    p["name"]: p["containerPort"]
                    for p in template["spec"]["containers"][0].get("ports", [])
                }
                annotations = template["metadata"].get("annotations", {})
                server = kind == "StatefulSet"
                # Every shard pod has its own DNS name, so each serves on the port itself.
                assert (ports.get("metrics") == 9100) == (asked and server), (case, name)
                expected = {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": "9100",
                    "prometheus.io/path": "/metrics",
                }
                assert annotations == (expected if asked and server else {}), (case, name)


@pytest.mark.parametrize(("device", "gpus"), [("gpu", "1"), ("auto", None), ("cpu", None)])
def test_learners_get_a_gpu_when_the_config_asks(device, gpus):
    groups = k8s.manifests(load("pong_impala.yaml", f"learner.device={device}"), k8s.Options(IMAGE))
    for workload, pod in pod_specs(groups):
        (container,) = pod["containers"]
        limit = container["resources"]["limits"].get("nvidia.com/gpu")
        assert limit == (gpus if workload.endswith("-learner") else None), workload
        env = env_of(container)
        if not workload.endswith("-learner"):
            assert env["CUDA_VISIBLE_DEVICES"]["value"] == "-1"
        for key, value in MALLOC_ENV.items():  # glibc settings as the local launcher's
            assert env[key]["value"] == value


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "Pong_Apex"}, "--name 'Pong_Apex'"),
        ({"name": "x" * 41}, "at most 40"),
        ({"namespace": "-bad"}, "--namespace '-bad'"),
        ({"image": "has space"}, "--image"),
        ({"volume": "hostpath"}, "--volume"),
        ({"token": " padded "}, "token"),
        ({"cluster_domain": "Bad_Domain"}, "--cluster-domain 'Bad_Domain'"),
        ({"storage_class": "fast ssd"}, "--storage-class 'fast ssd'"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        k8s.Options(**{"image": IMAGE, **options})


def test_bad_configs_are_rejected():
    cfg = load("cartpole_apex.yaml", "run.name=Bad_Name")
    with pytest.raises(ConfigError, match="run.name"):
        k8s.manifests(cfg, k8s.Options(IMAGE))
    cfg = load("cartpole_apex.yaml", "security.tls_cert=c.pem", "security.tls_key=k.pem")
    with pytest.raises(ConfigError, match="tls"):
        k8s.manifests(cfg, k8s.Options(IMAGE))


def test_cli_prints_the_manifests_and_how_to_make_the_secret(capsys):
    config = str(ROOT / "configs" / "pong_impala.yaml")
    assert cli.main(["k8s", config, "--image", IMAGE, "--set", "cluster.actor=3"]) == 0
    out, err = capsys.readouterr()
    expected = k8s.manifests(load("pong_impala.yaml", "cluster.actor=3"), k8s.Options(IMAGE))
    assert list(yaml.safe_load_all(out)) == documents(expected)
    assert "kubectl -n default create secret generic pong-impala-token" in err


def test_cli_writes_one_file_per_role_with_the_secret(tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    out = tmp_path / "manifests"
    out.mkdir()
    (out / "evaluator.yaml").write_text("stale: a role this config no longer has\n")
    (out / "notes.yaml").write_text("mine: not a manifest group, left alone\n")
    args = ["k8s", str(ROOT / "configs" / "cartpole_apex.yaml"), "--image", IMAGE]
    args += [
        "--namespace",
        "rl",
        "--name",
        "cp",
        "--out",
        str(out),
        "--token-file",
        str(token_file),
    ]
    assert cli.main(args) == 0
    assert capsys.readouterr().out == ""
    stems = ("configmap", "secret", "ps", "memory", "learner", "actor")
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(["notes.yaml", *(f"{s}.yaml" for s in stems)])
    opts = k8s.Options(IMAGE, name="cp", namespace="rl", token=TOKEN)
    expected = k8s.manifests(load("cartpole_apex.yaml"), opts)
    for stem, docs in expected.items():
        assert list(yaml.safe_load_all((out / f"{stem}.yaml").read_text())) == docs


def test_cli_renders_a_sweep_as_one_set_of_manifests_per_trial(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["k8s", str(ROOT / "configs" / "cartpole_ppo.yaml"), "--image", IMAGE, "--out", str(out)]
    args += ["--grid", "algorithm.lr=0.0003,0.001", "--seeds", "2", "--set", "cluster.actor=3"]
    assert cli.main(args) == 0
    trials = (out / "trials.csv").read_text().splitlines()
    assert trials[0] == "trial,name,overrides" and len(trials) == 5
    assert trials[4] == 'lr=0.001,seed=1,cartpole-ppo-t3,"algorithm.lr=0.001 run.seed=1"'
    assert "create each trial's token Secret first" in capsys.readouterr().err
    for index, (lr, seed) in enumerate([("0.0003", 0), ("0.0003", 1), ("0.001", 0), ("0.001", 1)]):
        folder = out / f"lr={lr},seed={seed}"
        expected = k8s.manifests(
            load("cartpole_ppo.yaml", "cluster.actor=3", f"algorithm.lr={lr}", f"run.seed={seed}"),
            k8s.Options(IMAGE, name=f"cartpole-ppo-t{index}"),
        )
        for stem, docs in expected.items():
            assert list(yaml.safe_load_all((folder / f"{stem}.yaml").read_text())) == docs
    assert cli.main([*args[:4], "--grid", "algorithm.lr=1"]) == 2  # a sweep needs --out
    assert "give --out DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--name", "UPPER"], "k8s: --name 'UPPER'"),
        (["--token-file", "/nonexistent/token"], "cannot read the token file"),
        (["--set", "cluster.actor=0"], "cluster.actor"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(capsys, extra, message):
    args = ["k8s", str(ROOT / "configs" / "cartpole_apex.yaml"), "--image", IMAGE, *extra]
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_the_dockerfile_runs_what_the_manifests_expect():
    # The image is not built here (no registry access needed); what the manifests rely on
    # is checked against the Dockerfile: entrypoint, user, run directory, build variants.
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    (entrypoint,) = [line[len("ENTRYPOINT") :] for line in lines if line.startswith("ENTRYPOINT")]
    assert json.loads(entrypoint) == ["easyrl"]
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert int(user) == k8s.USER_ID
    assert f"mkdir -p {k8s.RUN_DIR}" in text
    assert "ARG VARIANT=cpu" in lines
    assert re.search(r"cpu\) extras=atari ;;", text) and re.search(r"gpu\) extras=atari,gpu", text)
    kept = (ROOT / ".dockerignore").read_text().split()
    assert {"!setup.py", "!pyproject.toml", "!README.md", "!easyrl/"} <= set(kept)
