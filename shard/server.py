"""``create_server(db, address) -> (serving, port)``: a shard's gRPC server, built, not started.

The server carries KV and Admin for ``db``, the health service and reflection
(:mod:`shard.serving`), and the message limits of :mod:`shard.limits` in both directions.
``SO_REUSEPORT`` is off: two shards must never share a port by accident. With ``tls``
(:mod:`shard.tls`) the port serves TLS (mTLS when it names a client CA) instead of plaintext.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from engine.errors import InvalidArgumentError
from sievekv_proto import sievekv_pb2_grpc as pbg

from .limits import Limits
from .metrics import RequestMetrics
from .serving import ADMIN_SERVICE, KV_SERVICE, Serving
from .servicer import AdminServicer, KVServicer
from .status import Guard
from .tls import ServerTls, add_port

DEFAULT_WORKERS = 16


def bind(server: grpc.Server, address: str, tls: ServerTls | None = None) -> int:
    """Bind ``address`` (``host:port``, port 0 = any free one), plaintext or with ``tls``;
    return the bound port.

    Raises InvalidArgumentError naming the address when it cannot be bound.
    """
    try:
        port = add_port(server, address, tls)
    except RuntimeError as exc:
        raise InvalidArgumentError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise InvalidArgumentError(f"cannot listen on {address}")
    return port


def server_options(limits: Limits, reuse_port: bool = False) -> list[tuple[str, int]]:
    return [*limits.grpc_options(), ("grpc.so_reuseport", 1 if reuse_port else 0)]


def create_server(db, address: str, *, name: str = "shard", limits: Limits | None = None,
                  metrics: RequestMetrics | None = None,
                  max_workers: int = DEFAULT_WORKERS,
                  tls: ServerTls | None = None) -> tuple[Serving, int]:
    """Build a server for ``db`` bound to ``address`` (TLS with ``tls``); return
    ``(serving, port)``.

    ``serving.start()`` starts it; ``serving.drain(grace)`` stops it gracefully. The caller
    owns ``db`` (closes it after the server stopped).
    """
    limits = limits or Limits()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers, thread_name_prefix="shard"),
                         options=server_options(limits))
    port = bind(server, address, tls)
    own_address = f"{address.rsplit(':', 1)[0]}:{port}"
    guard = Guard(f"shard {name}", metrics)
    kv = KVServicer(db, limits, name, max_scans=max(1, max_workers // 2))
    pbg.add_KVServicer_to_server(guard.wrap(kv, KV_SERVICE), server)
    pbg.add_AdminServicer_to_server(
        guard.wrap(AdminServicer(db, name, own_address), ADMIN_SERVICE), server)
    return Serving(server, [guard]), port
