"""What waiting costs in gRPC Python: client and server CPU per unary call against the time
the handler takes (a diagnostic for bench/grpc_bench.py's MultiGet figures).

A bare grpc server (sync, thread pool of 8, our proto, no sievekv code) answers Get after
sleeping --delays milliseconds; one client calls it back to back for --seconds per delay.
Printed per delay: calls/s, the client process's CPU per call and the server process's CPU
per call, and how much each grew against the 0 ms baseline measured in the same run (in total
and per millisecond of handler time). A sleeping handler uses no CPU itself, so any growth is
what gRPC's own threads spend because a call is outstanding for longer (measured here: a
roughly fixed ~200 us per call in each process once the answer is not immediate, i.e. thread
sleeps and wake-ups, not a spin proportional to the wait): the price every process on a
call's path pays for a slower shard, on top of the shard's own work.

Run: python3 bench/grpc_wait_cpu.py [--delays 0,2,5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _server(port_queue, delay_s: float) -> None:
    from concurrent import futures

    import grpc

    sys.path.insert(0, REPO)
    from sievekv_proto import sievekv_pb2 as pb
    from sievekv_proto import sievekv_pb2_grpc as pbg

    class Sleeper(pbg.KVServicer):
        def Get(self, request, context):
            if delay_s:
                time.sleep(delay_s)
            return pb.GetResponse(found=True, value=b"v" * 100)

    server = grpc.server(futures.ThreadPoolExecutor(8))
    pbg.add_KVServicer_to_server(Sleeper(), server)
    port_queue.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", default="0,2,5", help="handler sleeps, milliseconds")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    mp.set_start_method("spawn")  # before any gRPC object exists in this process
    rows = []
    for delay in delays:
        q = mp.Queue()
        proc = mp.Process(target=_server, args=(q, delay / 1000), daemon=True)
        proc.start()
        try:
            port = q.get(timeout=60)
            import grpc
            import psutil

            sys.path.insert(0, REPO)
            from sievekv_proto import sievekv_pb2 as pb
            from sievekv_proto import sievekv_pb2_grpc as pbg

            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            stub = pbg.KVStub(channel)
            request = pb.GetRequest(key=b"k")
            for _ in range(20):
                stub.Get(request, timeout=10)
            me, srv = psutil.Process(), psutil.Process(proc.pid)
            c0, s0, t0, n = sum(me.cpu_times()[:2]), sum(srv.cpu_times()[:2]), time.time(), 0
            while time.time() - t0 < args.seconds:
                stub.Get(request, timeout=10)
                n += 1
            c1, s1, el = sum(me.cpu_times()[:2]), sum(srv.cpu_times()[:2]), time.time() - t0
            channel.close()
            rows.append((delay, n / el, (c1 - c0) / n * 1e6, (s1 - s0) / n * 1e6))
        finally:
            proc.kill()
            proc.join()
    print(f"gRPC wait cost: one client, unary Get, handler sleeps; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'handler ms':>10}{'calls/s':>9}{'client us/call':>16}{'server us/call':>16}"
          f"{'client +us':>12}{'server +us':>12}{'client +us/ms':>15}{'server +us/ms':>15}")
    base = rows[0]
    for delay, rate, cli, srv in rows:
        if delay == base[0]:
            grow = f"{'baseline':>12}{'baseline':>12}{'':>15}{'':>15}"
        else:
            dc, ds, dt = cli - base[2], srv - base[3], delay - base[0]
            grow = f"{dc:12.0f}{ds:12.0f}{dc / dt:15.0f}{ds / dt:15.0f}"
        print(f"{delay:10.1f}{rate:9.0f}{cli:16.0f}{srv:16.0f}{grow}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
