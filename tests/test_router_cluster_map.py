"""Slot function and cluster map validation."""

import mmh3
import pytest

from router import cluster_map as cm
from router.slots import SLOT_COUNT, slot_of


def test_slot_function_is_unsigned_murmur3_32_mod_16384():
    for key in (b"a", b"hello", b"\xff" * 100, b"user:1234"):
        h = mmh3.hash(key, 0, signed=False)
        assert 0 <= h < 2 ** 32
        assert slot_of(key) == h % SLOT_COUNT
    # a key whose signed hash is negative: a signed modulo would give another slot
    key = next(k for k in (b"k%d" % i for i in range(1000)) if mmh3.hash(k, 0) < 0)
    assert slot_of(key) == (mmh3.hash(key, 0) + 2 ** 32) % SLOT_COUNT
    assert slot_of(b"hello") == 14919  # pinned: moving keys between shards is a format change


def test_slots_spread_over_all_ranges():
    counts = [0] * 4
    for i in range(20000):
        counts[slot_of(b"key%d" % i) * 4 // SLOT_COUNT] += 1
    assert min(counts) > 4500, counts


def doc(*shards, **top):
    return {**top, "shards": [dict(name=n, address=a, slots=s) for n, a, s in shards]}


def test_valid_map_and_lookup():
    m = cm.parse(doc(("a", "h1:1", [[0, 99], [200, 16383]]), ("b", "h2:1", [100, 199])))
    assert [s.name for s in m.shards] == ["a", "b"]
    assert m.shards[1].slots == ((100, 199),)
    key = next(k for k in (b"k%d" % i for i in range(100000)) if 100 <= slot_of(k) <= 199)
    assert m.shard_for(key).name == "b"
    assert m.shard_index(key) == 1


def test_even_and_toml_round_trip(tmp_path):
    m = cm.ClusterMap.even([(f"s{i}", f"127.0.0.1:{7000 + i}") for i in range(3)])
    assert [s.slots for s in m.shards] == [((0, 5460),), ((5461, 10921),), ((10922, 16383),)]
    path = tmp_path / "map.toml"
    path.write_text(m.to_toml())
    assert cm.load(str(path)) == m


@pytest.mark.parametrize("document, message", [
    ({}, "no shards"),
    ({"shards": []}, "no shards"),
    (doc(("a", "h:1", [0, 16383]), extra=1), "unknown top-level key(s): extra"),
    (doc(("a", "h:1", [0, 16383]), slot_count=1024), "slot_count must be 16384"),
    ({"shards": [{"name": "a", "slots": [0, 16383]}]}, "missing 'address'"),
    ({"shards": [{"name": "a", "address": "h:1", "slots": [0, 16383], "weight": 2}]}, "unknown key(s): weight"),
    (doc(("", "h:1", [0, 16383])), "name must be a non-empty string"),
    (doc(("a", "h:1", [0, 8191]), ("a", "h:2", [8192, 16383])), "duplicate shard name"),
    (doc(("a/b", "h:1", [0, 16383])), "cannot contain '/'"),
    (doc(("..", "h:1", [0, 16383])), "cannot be '.' or '..'"),
    (doc(("a\nb", "h:1", [0, 16383])), "cannot contain control characters"),
    (doc(("x" * 256, "h:1", [0, 16383])), "longer than 255 bytes"),
    (doc(("a", "h:1", [0, 8191]), ("b", "h:1", [8192, 16383])), "also used by shard 'a'"),
    (doc(("a", "nohost", [0, 16383])), "is not 'host:port'"),
    (doc(("a", "h:99999", [0, 16383])), "is not 'host:port'"),
    (doc(("a", "h:1", [5, 2])), "0 <= first <= last <= 16383"),
    (doc(("a", "h:1", [0, 16384])), "0 <= first <= last <= 16383"),
    (doc(("a", "h:1", "0-16383")), "slots must be a list"),
    (doc(("a", "h:1", [[0, 1, 2]])), "is not a [first, last] pair"),
    (doc(("a", "h:1", [0, 9000]), ("b", "h:2", [8192, 16383])), "slot 8192 is assigned to both 'a' and 'b'"),
    (doc(("a", "h:1", [0, 8000]), ("b", "h:2", [8192, 16383])), "slots 8001-8191 are not assigned to any shard"),
    (doc(("a", "h:1", [1, 16383])), "slots 0-0 are not assigned"),
])
def test_invalid_maps_name_the_problem(document, message):
    with pytest.raises(cm.ClusterMapError) as info:
        cm.parse(document)
    assert message in str(info.value)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(cm.ClusterMapError, match="cannot read cluster map .*missing.toml"):
        cm.load(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shards]\nname=")
    with pytest.raises(cm.ClusterMapError, match="bad.toml: not valid TOML"):
        cm.load(str(bad))


def test_deploy_example_map_is_valid():
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "cluster.example.toml")
    m = cm.load(path)
    assert [s.address for s in m.shards] == ["10.0.0.11:7000", "10.0.0.12:7000", "10.0.0.13:7000"]
