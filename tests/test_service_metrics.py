"""Prometheus metrics served by real shard and router processes on --metrics-port."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from router.client import Client

from .conftest import free_port, start_router_process, start_shard_process, write_cluster_map


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_shard_and_router_metrics(procs, tmp_path):
    shard_metrics, router_metrics = free_port(), free_port()
    shard = start_shard_process(procs, str(tmp_path / "s0"), name="s0",
                                extra=("--metrics-port", str(shard_metrics)))
    map_path = write_cluster_map(str(tmp_path / "cluster.toml"), [shard])
    router = start_router_process(procs, map_path, extra=("--metrics-port", str(router_metrics)))
    with Client(router.address, retries=0) as c:
        c.put(b"k", b"v")
        for _ in range(5):
            assert c.get(b"k") == b"v"
        try:
            c.get(b"")
        except Exception:
            pass
    for port in (shard_metrics, router_metrics):
        samples = scrape(port)
        assert samples[("sievekv_requests_total", (("code", "OK"), ("method", "Get")))] == 5
        assert samples[("sievekv_requests_total", (("code", "OK"), ("method", "Put")))] == 1
        assert samples[("sievekv_request_duration_seconds_count", (("method", "Get"),))] >= 5
    router_samples = scrape(router_metrics)
    assert router_samples[("sievekv_requests_total", (("code", "INVALID_ARGUMENT"), ("method", "Get")))] == 1
    shard_samples = scrape(shard_metrics)
    assert any(name.startswith("sievekv_engine_") for name, _ in shard_samples)
    assert shard_samples[("sievekv_engine_scrape_errors_total", ())] == 0
