"""The gRPC floor for bench/grpc_bench.py: a minimal echo KV service with the same two hops.

``python3 bench/echo_server.py --listen 127.0.0.1:0 --port-file F`` is the echo "shard": Get
answers found with a fixed 100-byte value, Put answers at once, MultiGet answers every key
found. ``--forward HOST:PORT`` makes it the echo "router": each call is passed unchanged to
that address over one long-lived channel. No validation, no routing, no metrics, no storage:
what is left is gRPC and protobuf, served the same way as sievekv (sync server, thread pool,
same message limits), so sievekv's ratio to it is the cost of sievekv's own work.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc  # noqa: E402

from shard.limits import Limits  # noqa: E402
from shard.server import server_options  # noqa: E402
from shard.worker import wait_for_stop, write_port_file  # noqa: E402
from sievekv_proto import sievekv_pb2 as pb  # noqa: E402
from sievekv_proto import sievekv_pb2_grpc as pbg  # noqa: E402

VALUE = b"v" * 100


class EchoBackend(pbg.KVServicer):
    def Get(self, request, context):
        return pb.GetResponse(found=True, value=VALUE)

    def Put(self, request, context):
        return pb.PutResponse()

    def MultiGet(self, request, context):
        n = len(request.keys)
        return pb.MultiGetResponse(found=[True] * n, values=[VALUE] * n)


class EchoForwarder(pbg.KVServicer):
    def __init__(self, address: str, limits: Limits):
        self.stub = pbg.KVStub(grpc.insecure_channel(address, options=limits.grpc_options()))

    def Get(self, request, context):
        return self.stub.Get(request, timeout=10)

    def Put(self, request, context):
        return self.stub.Put(request, timeout=10)

    def MultiGet(self, request, context):
        return self.stub.MultiGet(request, timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--port-file")
    p.add_argument("--forward", help="be the echo router: forward every call to this address")
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT (several echo routers)")
    p.add_argument("--workers", type=int, default=32)
    args = p.parse_args()
    limits = Limits()
    server = grpc.server(futures.ThreadPoolExecutor(args.workers),
                         options=server_options(limits, args.reuse_port))
    servicer = EchoForwarder(args.forward, limits) if args.forward else EchoBackend()
    pbg.add_KVServicer_to_server(servicer, server)
    port = server.add_insecure_port(args.listen)
    server.start()
    if args.port_file:
        write_port_file(args.port_file, port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    wait_for_stop(stop)
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
