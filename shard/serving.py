"""What every sievekv server carries besides its own services: the standard health service
(grpc.health.v1), server reflection, and graceful draining.

Draining (``Serving.drain``), in order:
1. health turns NOT_SERVING for every service (``enter_graceful_shutdown``);
2. the guards refuse every new call with UNAVAILABLE (the server still answers, so health
   checks see NOT_SERVING and clients get a clear refusal rather than a closed port);
3. in-flight calls finish: the drain waits until the guards count none (``grace`` seconds at
   most), then stops the server: it stops taking connections and calls at once (clients see
   UNAVAILABLE and reconnect elsewhere), and the calls gRPC had already received but not yet
   given to a handler are still handed to the guards, which refuse them with UNAVAILABLE (the
   rest of the grace, at least 0.5 s); only what is still running after that is cancelled
   (stopping with a shorter grace cancelled those queued calls: clients saw CANCELLED);
then the owner closes its resources (the shard flushes and closes its engine).
"""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sievekv_proto import sievekv_pb2

KV_SERVICE = sievekv_pb2.DESCRIPTOR.services_by_name["KV"]
ADMIN_SERVICE = sievekv_pb2.DESCRIPTOR.services_by_name["Admin"]
SERVICE_NAMES = (KV_SERVICE.full_name, ADMIN_SERVICE.full_name)


class Serving:
    """A started-or-not grpc server with its health servicer and handler guards."""

    def __init__(self, server: grpc.Server, guards, on_stop=()):
        self.server = server
        self.guards = list(guards)
        self.on_stop = list(on_stop)  # callables run once the server has stopped
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for name in ("", *SERVICE_NAMES):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    def start(self) -> None:
        self.server.start()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)

    def drain(self, grace: float) -> None:
        """NOT_SERVING, refuse new calls, let in-flight calls finish (<= ``grace`` s), stop."""
        self.health.enter_graceful_shutdown()
        for guard in self.guards:
            guard.draining = True
        deadline = time.monotonic() + grace
        while any(g.in_flight for g in self.guards) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.stop(max(0.5, deadline - time.monotonic()))

    def stop(self, grace: float | None = None) -> None:
        """Stop (without the NOT_SERVING step), then run the ``on_stop`` callables."""
        self.server.stop(grace).wait()
        callbacks, self.on_stop = self.on_stop, []
        for callback in callbacks:
            callback()
