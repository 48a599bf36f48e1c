"""Tests of easyrl.cluster.spec: ClusterSpec parsing and validation, and assign_shards."""

import itertools
import json
import random

import pytest

from easyrl.cluster import spec as spec_module
from easyrl.cluster.spec import ClusterSpec, assign_shards
from easyrl.errors import ConfigError

GOOD = {"ps": ["h0:7000", "h1:7001"], "memory": ["h2:7100"], "learner": 2, "actor": 8}


def with_changes(**changes):
    raw = dict(GOOD)
    raw.update(changes)
    return raw


# --- ClusterSpec --------------------------------------------------------------------------


def test_from_mapping_good():
    spec = ClusterSpec.from_mapping(GOOD)
    assert spec == ClusterSpec(ps=("h0:7000", "h1:7001"), memory=("h2:7100",), learner=2, actor=8)
    assert isinstance(spec.ps, tuple) and isinstance(spec.memory, tuple)
    assert spec.learner == 2 and spec.actor == 8


def test_spec_is_frozen_and_hashable():
    spec = ClusterSpec.from_mapping(GOOD)
    with pytest.raises(AttributeError):
        spec.actor = 3
    assert hash(spec) == hash(ClusterSpec.from_mapping(GOOD))


@pytest.mark.parametrize(
    "address", ["localhost:1", "10.0.0.1:65535", "[::1]:7000", "my-host.example.com:80"]
)
def test_from_mapping_accepts_address_forms(address):
    assert ClusterSpec.from_mapping(with_changes(ps=[address])).ps == (address,)


def test_comma_separated_string_hosts():
    spec = ClusterSpec.from_mapping(with_changes(ps="h0:7000,h1:7001", memory="h2:7100,"))
    assert spec.ps == ("h0:7000", "h1:7001")
    assert spec.memory == ("h2:7100",)


def test_tuple_hosts_are_accepted():
    assert ClusterSpec.from_mapping(with_changes(ps=("a:1", "b:2"))).ps == ("a:1", "b:2")


@pytest.mark.parametrize(
    ("key", "suggestion"), [("acter", "actor"), ("learners", "learner"), ("memroy", "memory")]
)
def test_unknown_key_with_suggestion(key, suggestion):
    raw = dict(GOOD)
    raw[key] = raw.pop(suggestion)
    with pytest.raises(ConfigError, match=rf"unknown key '{key}'.*did you mean '{suggestion}'"):
        ClusterSpec.from_mapping(raw)


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError, match="valid keys") as info:
        ClusterSpec.from_mapping(with_changes(zzzzzz=1))
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("key", ["ps", "memory", "learner", "actor"])
def test_missing_key(key):
    raw = dict(GOOD)
    del raw[key]
    with pytest.raises(ConfigError, match=f"missing {key}"):
        ClusterSpec.from_mapping(raw)


def test_all_missing_keys_are_named():
    with pytest.raises(ConfigError, match="missing ps, memory, learner, actor"):
        ClusterSpec.from_mapping({})


@pytest.mark.parametrize(
    "address", ["h0", "h0:", ":7000", "h0:port", "h0:70a0", "h0:-1", "", "h0:7000 "]
)
@pytest.mark.parametrize("role", ["ps", "memory"])
def test_bad_address(role, address):
    with pytest.raises(ConfigError, match=f"cluster.{role}"):
        ClusterSpec.from_mapping(with_changes(**{role: ["ok:1", address]}))


@pytest.mark.parametrize("port", ["0", "00", "65536", "70000", "99999999999999999999"])
@pytest.mark.parametrize("role", ["ps", "memory"])
def test_port_out_of_range(role, port):
    with pytest.raises(ConfigError, match=rf"cluster\.{role}: 'h9:{port}'.*1\.\.65535"):
        ClusterSpec.from_mapping(with_changes(**{role: ["ok:1", f"h9:{port}"]}))


@pytest.mark.parametrize("port", ["1", "65535", "007000"])
def test_port_range_edges_are_accepted(port):
    assert ClusterSpec.from_mapping(with_changes(ps=[f"h9:{port}"])).ps == (f"h9:{port}",)


@pytest.mark.parametrize(
    "port",
    ["\u0667\u0660\u0660\u0660", "\uff17\uff10\uff10\uff10", "7\u00b2", "\u00b9", "70\u09e6"],
    ids=["arabic-indic", "fullwidth", "superscript", "superscript-one", "bengali"],
)
@pytest.mark.parametrize("role", ["ps", "memory"])
def test_non_ascii_digit_ports_are_rejected(role, port):
    assert port.isdigit()  # what the old check relied on
    with pytest.raises(ConfigError, match=rf"cluster\.{role}: .* is not host:port"):
        ClusterSpec.from_mapping(with_changes(**{role: ["ok:1", f"h9:{port}"]}))


@pytest.mark.parametrize("role", ["ps", "memory"])
def test_duplicate_address_within_a_role(role):
    with pytest.raises(ConfigError, match=rf"cluster\.{role}: address 'd:5' is listed twice"):
        ClusterSpec.from_mapping(with_changes(**{role: ["d:5", "e:6", "d:5"]}))


def test_duplicate_address_across_ps_and_memory():
    with pytest.raises(
        ConfigError, match=r"cluster\.memory: address 'h1:7001' is listed twice.*cluster\.ps"
    ):
        ClusterSpec.from_mapping(with_changes(memory=["h2:7100", "h1:7001"]))
    with pytest.raises(ConfigError, match=r"cluster\.memory: address 'h0:7000'"):
        ClusterSpec(ps=("h0:7000",), memory=("h0:7000",), learner=1, actor=1)


@pytest.mark.parametrize(
    ("ps", "memory", "match"),
    [
        (["h0:7000", "H0:7000"], ["m:1"], r"cluster\.ps: address 'H0:7000'.*'h0:7000'"),
        (["h0:7000"], ["h0:07000"], r"cluster\.memory: address 'h0:07000'.*cluster\.ps 'h0:7000'"),
        (["[::1]:5"], ["[::1]:005"], r"cluster\.memory: address '\[::1\]:005'"),
    ],
    ids=["host-case", "leading-zero-port", "ipv6"],
)
def test_duplicate_address_in_another_spelling(ps, memory, match):
    with pytest.raises(ConfigError, match=match):
        ClusterSpec.from_mapping(with_changes(ps=ps, memory=memory))


def test_same_host_different_ports_and_same_port_different_hosts_are_fine():
    spec = ClusterSpec.from_mapping(
        with_changes(ps=["h:1", "h:2", "g:1"], memory=["h:3", "g:2", "k:1"])
    )
    assert spec.ps == ("h:1", "h:2", "g:1") and spec.memory == ("h:3", "g:2", "k:1")


def test_validation_also_applies_to_direct_construction():
    with pytest.raises(ConfigError, match="cluster.ps"):
        ClusterSpec(ps=("h:0",), memory=("m:1",), learner=1, actor=1)
    with pytest.raises(ConfigError, match="cluster.memory"):
        ClusterSpec(ps=("h:1",), memory=("m:\u0661",), learner=1, actor=1)


@pytest.mark.parametrize("value", [[], "", ","])
def test_empty_ps_address_list(value):
    with pytest.raises(ConfigError, match="at least one address"):
        ClusterSpec.from_mapping(with_changes(ps=value))


@pytest.mark.parametrize("value", [[], "", ","])
def test_no_memory_and_no_learner_is_a_valid_shape(value):
    # A3C's cluster: PS shards and actors only.
    spec = ClusterSpec.from_mapping(with_changes(memory=value, learner=0))
    assert spec.memory == () and spec.learner == 0


@pytest.mark.parametrize("value", [7000, ["h0:1", 7000], {"h0:1": 1}, b"h0:1", None])
def test_address_list_of_wrong_type(value):
    with pytest.raises(ConfigError, match="cluster.ps"):
        ClusterSpec.from_mapping(with_changes(ps=value))


@pytest.mark.parametrize(
    "role, count, minimum",
    [("actor", -1, 0), ("learner", -1, 0)],  # 0 actors: offline runs
)
def test_counts_below_the_minimum(role, count, minimum):
    with pytest.raises(ConfigError, match=f"cluster.{role}: must be >= {minimum}"):
        ClusterSpec.from_mapping(with_changes(**{role: count}))


@pytest.mark.parametrize("role", ["learner", "actor"])
@pytest.mark.parametrize("count", [True, False, 2.0, "2", None])
def test_non_int_counts_are_rejected(role, count):
    with pytest.raises(ConfigError, match=f"cluster.{role}: expected an int"):
        ClusterSpec.from_mapping(with_changes(**{role: count}))


@pytest.mark.parametrize("raw", [None, [], "ps: h:1", 3])
def test_from_mapping_requires_a_mapping(raw):
    with pytest.raises(ConfigError, match="must be a mapping"):
        ClusterSpec.from_mapping(raw)


def test_to_json_round_trip():
    spec = ClusterSpec.from_mapping(GOOD)
    text = spec.to_json()
    assert json.loads(text) == {**GOOD, "evaluator": 0}  # the optional role, filled in
    assert ClusterSpec.from_mapping(json.loads(text)) == spec
    with_evaluator = ClusterSpec.from_mapping({**GOOD, "evaluator": 1})
    assert with_evaluator.evaluator == 1
    assert ClusterSpec.from_mapping(json.loads(with_evaluator.to_json())) == with_evaluator


def test_from_env_valid(monkeypatch):
    monkeypatch.setenv(spec_module.CLUSTER_ENV, json.dumps(GOOD))
    assert ClusterSpec.from_env() == ClusterSpec.from_mapping(GOOD)


def test_from_env_round_trip_of_to_json(monkeypatch):
    spec = ClusterSpec.from_mapping(with_changes(ps="a:1,b:2,c:3", actor=1))
    monkeypatch.setenv("EASYRL_CLUSTER", spec.to_json())
    assert ClusterSpec.from_env() == spec


@pytest.mark.parametrize("text", ["{", "ps=h:1", "{'ps': ['h:1']}"])
def test_from_env_invalid_json(monkeypatch, text):
    monkeypatch.setenv("EASYRL_CLUSTER", text)
    with pytest.raises(ConfigError, match="EASYRL_CLUSTER is not valid JSON"):
        ClusterSpec.from_env()


def test_from_env_valid_json_bad_spec(monkeypatch):
    monkeypatch.setenv("EASYRL_CLUSTER", json.dumps(with_changes(acter=1)))
    with pytest.raises(ConfigError, match="did you mean 'actor'"):
        ClusterSpec.from_env()
    monkeypatch.setenv("EASYRL_CLUSTER", "[1, 2]")
    with pytest.raises(ConfigError, match="must be a mapping"):
        ClusterSpec.from_env()


def test_from_env_unset_or_empty(monkeypatch):
    monkeypatch.delenv("EASYRL_CLUSTER", raising=False)
    assert ClusterSpec.from_env() is None
    monkeypatch.setenv("EASYRL_CLUSTER", "")
    assert ClusterSpec.from_env() is None


def test_from_file_yaml(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "# cluster\nps:\n  - h0:7000\n  - h1:7001\nmemory: h2:7100\nlearner: 2\nactor: 8\n"
    )
    assert ClusterSpec.from_file(path) == ClusterSpec.from_mapping(GOOD)
    assert ClusterSpec.from_file(str(path)) == ClusterSpec.from_mapping(GOOD)


def test_from_file_json(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(GOOD))
    assert ClusterSpec.from_file(path) == ClusterSpec.from_mapping(GOOD)


@pytest.mark.parametrize(
    ("text", "match"),
    [("", "must be a mapping"), ("- h:1\n", "must be a mapping"), ("acter: 1\n", "actor")],
)
def test_from_file_bad_content(tmp_path, text, match):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        ClusterSpec.from_file(path)


# --- assign_shards ------------------------------------------------------------------------


def reference_assignment(sizes, num_shards):
    """Straightforward greedy: largest first (name breaks ties), to the least-loaded shard
    (lowest index breaks ties)."""
    loads = [0] * num_shards
    assignment = {}
    for name, size in sorted(sizes, key=lambda item: (-item[1], item[0])):
        shard = min(range(num_shards), key=lambda s: (loads[s], s))
        assignment[name] = shard
        loads[shard] += size
    return assignment


def shard_loads(sizes, assignment, num_shards):
    loads = [0] * num_shards
    for name, size in sizes:
        loads[assignment[name]] += size
    return loads


def test_assign_shards_hand_example():
    sizes = [("w0", 100), ("w1", 60), ("w2", 50), ("w3", 40)]
    assignment = assign_shards(sizes, 2)
    assert assignment == {"w0": 0, "w1": 1, "w2": 1, "w3": 0}
    assert shard_loads(sizes, assignment, 2) == [140, 110]


def test_assign_shards_three_shards_hand_example():
    sizes = [("a", 7), ("b", 5), ("c", 4), ("d", 3), ("e", 3), ("f", 1)]
    # a->0 (7,0,0); b->1 (7,5,0); c->2 (7,5,4); d->2 (7,5,7); e->1 (7,8,7); f->0 (8,8,7)
    assignment = assign_shards(sizes, 3)
    assert assignment == {"a": 0, "b": 1, "c": 2, "d": 2, "e": 1, "f": 0}
    assert assignment == reference_assignment(sizes, 3)


def test_assign_shards_ties_break_by_name_and_shard_index():
    sizes = [("z", 10), ("y", 10), ("x", 10), ("w", 10)]
    assert assign_shards(sizes, 2) == {"w": 0, "x": 1, "y": 0, "z": 1}
    # Zero-size variables leave shard 0 least loaded, so they all stay there.
    assert assign_shards([("b", 0), ("a", 0)], 3) == {"a": 0, "b": 0}


def test_assign_shards_is_independent_of_input_order():
    sizes = [
        ("dense/kernel", 4096),
        ("dense/bias", 64),
        ("out/kernel", 4096),
        ("out/bias", 8),
        ("emb", 1000),
        ("norm", 64),
        ("head", 2048),
    ]
    expected = assign_shards(sizes, 3)
    assert expected == reference_assignment(sizes, 3)
    for order in itertools.islice(itertools.permutations(sizes), 0, None, 97):
        assert assign_shards(list(order), 3) == expected
    assert assign_shards(tuple(reversed(sizes)), 3) == expected


def test_assign_shards_assigns_every_variable_to_a_valid_shard():
    rng = random.Random(7)
    sizes = [(f"v{i}", rng.randint(1, 10_000)) for i in range(50)]
    for num_shards in (1, 2, 3, 7, 50, 64):
        assignment = assign_shards(sizes, num_shards)
        assert set(assignment) == {name for name, _ in sizes}
        assert all(0 <= shard < num_shards for shard in assignment.values())


def test_assign_shards_single_shard():
    sizes = [("a", 3), ("b", 1), ("c", 2)]
    assert assign_shards(sizes, 1) == {"a": 0, "b": 0, "c": 0}


def test_assign_shards_more_shards_than_variables():
    sizes = [("small", 1), ("big", 30), ("mid", 20)]
    assert assign_shards(sizes, 5) == {"big": 0, "mid": 1, "small": 2}


def test_assign_shards_empty_input():
    assert assign_shards([], 3) == {}


@pytest.mark.parametrize(
    "sizes",
    [[("a", 1), ("a", 1)], [("a", 5), ("b", 2), ("a", 3)], [("x", 0), ("y", 1), ("x", 0)]],
)
def test_assign_shards_rejects_duplicate_names(sizes):
    with pytest.raises(ConfigError, match=r"duplicate variable names.*\['(a|x)'\]"):
        assign_shards(sizes, 2)


@pytest.mark.parametrize("num_shards", [0, -1])
def test_assign_shards_rejects_no_shards(num_shards):
    with pytest.raises(ConfigError, match=">= 1"):
        assign_shards([("a", 1)], num_shards)


def test_assign_shards_matches_reference_and_bound_on_random_inputs():
    rng = random.Random(12345)
    for _ in range(300):
        count = rng.randint(1, 40)
        num_shards = rng.randint(1, 9)
        high = rng.choice([1, 10, 1000, 10**9])
        sizes = [(f"var{i:02d}", rng.randint(0, high)) for i in range(count)]
        assignment = assign_shards(sizes, num_shards)
        assert assignment == reference_assignment(sizes, num_shards)
        loads = shard_loads(sizes, assignment, num_shards)
        total = sum(size for _, size in sizes)
        biggest = max(size for _, size in sizes)
        assert sum(loads) == total
        assert max(loads) <= total / num_shards + biggest
        shuffled = list(sizes)
        rng.shuffle(shuffled)
        assert assign_shards(shuffled, num_shards) == assignment
