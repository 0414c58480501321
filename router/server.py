"""``create_router_server(cluster_map, address) -> (serving, port)``: a router's gRPC server,
built, not started.

It serves KV and Admin for the whole cluster (:mod:`router.kv_servicer`,
:mod:`router.admin_servicer`), the health service and reflection, with one long-lived channel
per shard (closed when the server stops). With ``reuse_port`` several router processes can
bind the same port (SO_REUSEPORT); the kernel spreads connections between them. ``tls``
makes the listen port TLS (mTLS with a client CA); ``shard_tls`` the channels to the shards
(:mod:`shard.tls`).
"""

from __future__ import annotations

from concurrent import futures

import grpc

from shard.limits import Limits
from shard.metrics import RequestMetrics
from shard.server import bind, server_options
from shard.serving import ADMIN_SERVICE, KV_SERVICE, Serving
from shard.status import Guard
from shard.tls import ClientTls, ServerTls
from sievekv_proto import sievekv_pb2_grpc as pbg

from .admin_servicer import RouterAdmin
from .cluster_map import ClusterMap
from .kv_servicer import RouterKV
from .shards import ShardClient

DEFAULT_WORKERS = 32
DEFAULT_TIMEOUT = 10.0
DEFAULT_ADMIN_TIMEOUT = 600.0


def default_max_calls_per_shard(workers: int) -> int:
    """A quarter of the handler threads (at least 1) for reads, and as many for writes: a
    healthy shard answers in about a millisecond, so 8 calls in flight per shard and router
    process (at 32 workers) carry thousands of calls per second and let concurrent writes share
    a log append (group commit); a hung shard holds at most half the threads (its reads and
    writes), leaving the rest to the others. (With 4 write slots, 16 bench clients putting
    through one router measured ~0.9x the puts per second of no slots, within this VM's noise.)"""
    return max(1, workers // 4)


def create_router_server(cluster_map: ClusterMap, address: str, *, limits: Limits | None = None,
                         metrics: RequestMetrics | None = None,
                         default_timeout: float = DEFAULT_TIMEOUT,
                         admin_timeout: float = DEFAULT_ADMIN_TIMEOUT,
                         reuse_port: bool = False,
                         max_workers: int = DEFAULT_WORKERS,
                         max_calls_per_shard: int | None = None,
                         tls: ServerTls | None = None,
                         shard_tls: ClientTls | None = None) -> tuple[Serving, int]:
    """Build a router for ``cluster_map`` bound to ``address``; return ``(serving, port)``.

    ``default_timeout`` (unary data calls) and ``admin_timeout`` (Scan streams, Flush,
    Compact) apply when the client sets no deadline; otherwise the client's remaining time is
    passed to the shards. At most half of ``max_workers`` Scan streams are served at once.
    ``max_calls_per_shard``: reads, and as many writes, one shard may have waiting on it
    (router/shards.py, call slots); default a quarter of ``max_workers`` each, so a shard that
    stops answering holds at most half the handler threads and the others keep serving the
    other shards.
    """
    limits = limits or Limits()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers, thread_name_prefix="router"),
                         options=server_options(limits, reuse_port))
    port = bind(server, address, tls)
    if max_calls_per_shard is None:
        max_calls_per_shard = default_max_calls_per_shard(max_workers)
    shards = [ShardClient(spec, limits, max_calls_per_shard, shard_tls)
              for spec in cluster_map.shards]
    guard = Guard("router", metrics)
    pbg.add_KVServicer_to_server(
        guard.wrap(RouterKV(cluster_map, shards, limits, default_timeout,
                            scan_timeout=admin_timeout, max_scans=max(1, max_workers // 2)),
                   KV_SERVICE), server)
    pbg.add_AdminServicer_to_server(
        guard.wrap(RouterAdmin(cluster_map, shards, default_timeout, admin_timeout), ADMIN_SERVICE),
        server)
    return Serving(server, [guard], on_stop=[s.close for s in shards]), port
