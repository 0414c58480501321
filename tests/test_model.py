"""Stateful model test: random operations against engine.DB and a plain dict must agree.

Small memtables and tables force flushes and compactions; reopen checks recovery from the
logs and the manifest. Hypothesis shrinks any failure to a short sequence of operations.
"""

import shutil
import tempfile

import pytest

from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from engine import DB

OPTS = dict(memtable_bytes=8192, target_file_size=2048, max_bytes_for_level_base=8192,
            block_size=256, l0_compaction_trigger=2, l0_slowdown_trigger=4, l0_stop_trigger=6,
            slowdown_sleep_s=0.0, block_cache_bytes=4096)

keys = st.binary(min_size=1, max_size=6).map(lambda b: b"k" + b)
values = st.binary(min_size=0, max_size=60)


class DBModel(RuleBasedStateMachine):
    """With the default options: lz4 block compression (blocks that save 1/8 compressed)."""

    known = Bundle("known")
    opts = OPTS

    @initialize()
    def start(self):
        self.dir = tempfile.mkdtemp(prefix="sievekv-model-")
        self.db = DB.open(self.dir, **self.opts)
        self.model: dict[bytes, bytes] = {}

    def teardown(self):
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(target=known, key=keys, value=values)
    def put(self, key, value):
        self.db.put(key, value)
        self.model[key] = value
        return key

    @rule(key=st.one_of(keys, known))
    def delete(self, key):
        self.db.delete(key)
        self.model.pop(key, None)

    @rule(batch=st.lists(st.tuples(st.one_of(keys, st.sampled_from([b"kA", b"kB"])),
                                   st.one_of(st.none(), values)), max_size=8))
    def write_batch(self, batch):
        self.db.write(batch)
        for k, v in batch:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    @rule(n=st.integers(1, 60), value=values)
    def bulk(self, n, value):
        for i in range(n):
            k = b"bulk%03d" % i
            self.db.put(k, value + b"%d" % i)
            self.model[k] = value + b"%d" % i

    @rule(key=st.one_of(keys, known))
    def get(self, key):
        assert self.db.get(key) == self.model.get(key)

    @rule(ks=st.lists(st.one_of(keys, known), max_size=6))
    def multi_get(self, ks):
        assert self.db.multi_get(ks) == [self.model.get(k) for k in ks]

    @rule(start=st.one_of(st.none(), keys), end=st.one_of(st.none(), keys),
          limit=st.one_of(st.none(), st.integers(0, 20)))
    def scan(self, start, end, limit):
        want = sorted((k, v) for k, v in self.model.items()
                      if (start is None or k >= start) and (end is None or k < end))
        if start is not None and end is not None and start >= end:
            want = []
        if limit is not None:
            want = want[:limit]
        assert list(self.db.scan(start, end, limit)) == want

    @rule()
    def flush(self):
        self.db.flush()

    @rule()
    def compact(self):
        self.db.compact()

    @rule()
    def reopen(self):
        self.db.close()
        self.db = DB.open(self.dir, **self.opts)

    @invariant()
    def no_background_failure(self):
        if hasattr(self, "db"):
            assert self.db.stats()["failed"] is None


DBModel.TestCase.settings = settings(max_examples=25, stateful_step_count=40, deadline=None)
TestDBModel = DBModel.TestCase


class DBModelZstdPread(DBModel):
    """Zstandard blocks read with pread through the block cache, and compression off, each
    against the same dict (docs/format.md "Block compression")."""

    opts = dict(OPTS, compression="zstd", mmap_reads=False)


class DBModelUncompressed(DBModel):
    opts = dict(OPTS, compression="none")


class DBModelSubcompactions(DBModel):
    """Compactions of 4+ target sizes split into 2 key ranges written by table workers at
    once (engine/compaction/subcompaction.py). table_workers 1 keeps the process's shared
    pool at its usual 2 workers."""

    opts = dict(OPTS, max_subcompactions=2, table_workers=1)


for _m in (DBModelZstdPread, DBModelUncompressed, DBModelSubcompactions):
    _m.TestCase.settings = settings(max_examples=15, stateful_step_count=40, deadline=None)
TestDBModelZstdPread = DBModelZstdPread.TestCase
TestDBModelUncompressed = DBModelUncompressed.TestCase
TestDBModelSubcompactions = DBModelSubcompactions.TestCase


@pytest.mark.parametrize("compression", ["lz4", "zstd", "none"])
def test_full_scan_matches_after_many_random_writes(tmp_path, compression):
    """A longer deterministic run than hypothesis does, to reach several levels."""
    import random

    rnd = random.Random(5)
    model = {}
    with DB.open(tmp_path / "db", **dict(OPTS, compression=compression)) as db:
        for i in range(4000):
            k = b"k%04d" % rnd.randrange(1500)
            if rnd.random() < 0.2:
                db.delete(k)
                model.pop(k, None)
            else:
                v = b"v%d" % i
                db.put(k, v)
                model[k] = v
        db.flush()
        st_ = db.stats()
        assert sum(1 for lv in st_["levels"][1:] if lv["tables"]) >= 2
        assert (st_["compression"]["compressed_data_blocks"] > 0) == (compression != "none")
        assert list(db.scan()) == sorted(model.items())
        assert db.multi_get(list(model)) == list(model.values())
