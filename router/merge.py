"""Scan through the router: merge the shards' ordered streams into one ordered stream.

Each shard streams its own keys in order (batches of entries); a key lives on exactly one
shard, so ``heapq.merge`` of the per-shard entry iterators yields the cluster's keys in order
with no ties. The merge stops at the limit and cancels every shard stream (also when the
client cancels or a shard fails), so shards stop reading as soon as the answer is complete.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

import grpc

from sievekv_proto import sievekv_pb2 as pb

from .shards import ShardClient

BATCH_ENTRIES = 512
BATCH_BYTES = 256 * 1024


def shard_entries(shard: ShardClient, call) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs of one shard's Scan stream; a failure names the shard."""
    try:
        for batch in call:
            yield from zip(batch.keys, batch.values)
    except grpc.RpcError as exc:
        raise shard.error(exc) from None


def batches(entries: Iterable[tuple[bytes, bytes]], limit: int) -> Iterator[pb.ScanResponse]:
    """Group ``entries`` into ScanResponse messages, stopping after ``limit`` (0 = none)."""
    keys: list[bytes] = []
    values: list[bytes] = []
    size = 0
    left = limit or -1
    prev = None
    for key, value in entries:
        if key == prev:
            # Two streams gave the same key: one shard process named twice in the cluster
            # map (127.0.0.1:P and localhost:P), or data a map change left behind. A scan
            # shows each key once (the first stream's entry).
            continue
        prev = key
        keys.append(key)
        values.append(value)
        size += len(key) + len(value)
        left -= 1
        if left == 0:
            break
        if len(keys) >= BATCH_ENTRIES or size >= BATCH_BYTES:
            yield pb.ScanResponse(keys=keys, values=values)
            keys, values, size = [], [], 0
    if keys:
        yield pb.ScanResponse(keys=keys, values=values)


def merged_scan(calls: list[tuple[ShardClient, object]], limit: int) -> Iterator[pb.ScanResponse]:
    """The merged, limited stream of ``calls`` = [(shard, Scan response iterator)].

    Cancels every shard call when done, on error and when the consumer closes the generator.
    """
    try:
        if len(calls) == 1:
            yield from batches(shard_entries(*calls[0]), limit)
        else:
            yield from batches(heapq.merge(*(shard_entries(s, c) for s, c in calls)), limit)
    finally:
        for _, call in calls:
            call.cancel()
