"""engine/block_cache.py: an LRU bounded in bytes, with hit/miss counters, thread safe."""

import threading

from engine.block_cache import BlockCache


def test_hits_misses_and_lru_order():
    c = BlockCache(300)
    c.insert("a", "A", 100)
    c.insert("b", "B", 100)
    c.insert("c", "C", 100)
    assert c.get("a") == "A"  # a becomes most recent; b is now the oldest
    c.insert("d", "D", 100)
    assert c.get("b") is None
    assert [c.get(k) for k in "acd"] == ["A", "C", "D"]
    assert (c.hits, c.misses, c.evictions) == (4, 1, 1)
    assert c.usage == 300 and len(c) == 3


def test_usage_never_exceeds_capacity_and_oversized_entries_are_not_kept():
    c = BlockCache(1000)
    for i in range(50):
        c.insert(i, i, 1 + (i * 37) % 400)
        assert c.usage <= 1000
    c.insert("huge", 1, 1001)
    assert c.get("huge") is None
    assert c.usage <= 1000


def test_reinsert_replaces_and_erase_frees():
    c = BlockCache(100)
    c.insert("k", 1, 60)
    c.insert("k", 2, 30)
    assert c.get("k") == 2 and c.usage == 30
    c.erase("k")
    c.erase("k")
    assert c.usage == 0 and len(c) == 0
    assert c.stats() == {"capacity": 100, "usage": 0, "entries": 0, "hits": 1, "misses": 0,
                         "evictions": 0}


def test_concurrent_use_keeps_the_accounting_consistent():
    c = BlockCache(5000)

    def work(seed):
        for i in range(3000):
            k = (seed * 7 + i) % 97
            if c.get(k) is None:
                c.insert(k, k, 10 + k)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.hits + c.misses == 4 * 3000
    assert c.usage == sum(10 + k for k in range(97) if c.get(k) is not None)
    assert c.usage <= 5000
