"""router/preflight.py: the recorded shard layout of a local cluster's data directory."""

import errno
import json
import os

import pytest

from router import config, preflight


def _cfg(tmp_path):
    cfg = config.load(None, data_dir=str(tmp_path / "data"), cwd=str(tmp_path))
    os.makedirs(cfg.data_dir)
    return cfg


def test_first_start_records_the_layout_and_later_starts_must_match(tmp_path):
    cfg = _cfg(tmp_path)
    preflight.check_layout(cfg)
    path = os.path.join(cfg.data_dir, "cluster-layout.json")
    assert os.listdir(cfg.data_dir) == ["cluster-layout.json"]
    preflight.check_layout(cfg)  # the same layout: accepted
    with open(path, "w") as f:
        json.dump({"slots": [[0, 16383]]}, f)
    with pytest.raises(preflight.PreflightError, match="holds a cluster of 1 shard with"):
        preflight.check_layout(cfg)


def test_a_failed_first_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    # Was: a full disk at the first `cluster start` left cluster-layout.json.tmp behind.
    cfg = _cfg(tmp_path)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(preflight.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        preflight.check_layout(cfg)
    assert os.listdir(cfg.data_dir) == []
    monkeypatch.undo()
    preflight.check_layout(cfg)  # the next start records it
    assert os.listdir(cfg.data_dir) == ["cluster-layout.json"]
