"""Per-shard reports sent as trailing metadata, kept under gRPC's metadata size limit.

A Write or Flush/Compact that fails on some shards returns its full per-shard response in a
``-bin`` trailer (router/kv_servicer.py, router/admin_servicer.py). gRPC limits the metadata a
peer accepts: past 8 KiB (the default soft limit) calls are rejected at random, past 16 KiB
always, and the client then gets RESOURCE_EXHAUSTED and no report at all. A failure message is
~200 bytes, so a cluster with 40-odd failing shards would cross it. :func:`fit` keeps a report
within :data:`BUDGET`: if it is over, messages are shortened to :data:`MESSAGE_CHARS`, then the
text fields
named are cleared from the last entry backwards (the first failure's message always rides in
the status details too); the per-shard outcome (applied/ok, code) is never dropped. A report
that still does not fit (thousands of shards) is not sent, and the caller says so.
"""

from __future__ import annotations

BUDGET = 6 * 1024
"""Bytes a report may take in trailing metadata, leaving room under gRPC's 8 KiB soft limit."""

MESSAGE_CHARS = 160
"""Longest failure message kept per shard."""


def fit(response, entries, fields: tuple[str, ...]) -> bytes | None:
    """``response`` serialized within :data:`BUDGET` after trimming the ``fields`` (string
    fields of each message in ``entries``, a repeated field of ``response``, in the order
    given), or None if even without them it is too big. A report within the budget is sent
    whole (a Verify's message names every damaged file). Modifies ``response``."""
    if response.ByteSize() <= BUDGET:
        return response.SerializeToString()
    for e in entries:
        for f in fields:
            text = getattr(e, f)
            if len(text) > MESSAGE_CHARS:
                setattr(e, f, text[:MESSAGE_CHARS - 3] + "...")
    for f in fields:
        if response.ByteSize() <= BUDGET:
            break
        for e in reversed(entries):
            if getattr(e, f):
                setattr(e, f, "")
                if response.ByteSize() <= BUDGET:
                    break
    return response.SerializeToString() if response.ByteSize() <= BUDGET else None
