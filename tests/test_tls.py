"""TLS and mutual TLS on every gRPC hop (shard/tls.py), with real shard and router processes.

Certificates are made at test time (tests/tls_certs.py): a CA, a server certificate for
127.0.0.1 and localhost, a client certificate, and an unrelated CA with its own server and
client certificates. The module starts:

- ``plain``: a plaintext shard;
- ``tls``: a TLS shard, and a TLS router in front of it that verifies it with the CA;
- ``mtls``: a shard and a router that both require client certificates signed by the CA, the
  router connecting to the shard with the client certificate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from router import client_errors as errors
from router import cluster_state as cs
from router import health_probe
from router.client import Client
from router.cli import rpc
from shard import tls
from .conftest import REPO, start_router_process, start_shard_process, write_cluster_map
from .tls_certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def _server_flags(p: Pki, mtls: bool = False) -> tuple[str, ...]:
    flags = ("--tls-cert", p.server_cert, "--tls-key", p.server_key)
    return flags + (("--tls-client-ca", p.ca) if mtls else ())


class Net:
    def __init__(self, root, procs, p: Pki):
        self.pki = p
        self.plain = start_shard_process(procs, os.path.join(root, "plain", "d"), name="plain",
                                         wait=False)
        self.tls_shard = start_shard_process(procs, os.path.join(root, "tls", "d"), name="tls",
                                             extra=_server_flags(p), wait=False)
        self.mtls_shard = start_shard_process(procs, os.path.join(root, "mtls", "d"), name="mtls",
                                              extra=_server_flags(p, mtls=True), wait=False)
        for s in (self.plain, self.tls_shard, self.mtls_shard):
            s.wait_ready()
        tls_map = write_cluster_map(os.path.join(root, "tls", "map.toml"), [self.tls_shard])
        mtls_map = write_cluster_map(os.path.join(root, "mtls", "map.toml"), [self.mtls_shard])
        self.tls_router = start_router_process(
            procs, tls_map, name="tls-router", wait=False,
            extra=(*_server_flags(p), "--shard-tls-ca", p.ca))
        self.mtls_router = start_router_process(
            procs, mtls_map, name="mtls-router", processes=2, wait=False,
            extra=(*_server_flags(p, mtls=True), "--shard-tls-ca", p.ca,
                   "--shard-tls-cert", p.client_cert, "--shard-tls-key", p.client_key))
        self.tls_router.wait_ready()
        self.mtls_router.wait_ready()


@pytest.fixture(scope="module")
def net(module_procs, tmp_path_factory, pki) -> Net:
    return Net(str(tmp_path_factory.mktemp("tlsnet")), module_procs, pki)


def client(address: str, **kw) -> Client:
    return Client(address, retries=0, timeout=10, **kw)


def assert_unavailable(address: str, **kw) -> str:
    with client(address, **kw) as c:
        with pytest.raises(errors.UnavailableError) as info:
            c.get(b"k")
    return info.value.details


# -- credentials module ---------------------------------------------------------------------

def test_bad_files_name_the_file_and_the_problem(pki, tmp_path):
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    binary = tmp_path / "binary.der"
    binary.write_bytes(b"\x30\x82\xff\x00")
    missing = str(tmp_path / "missing.pem")
    cases = [
        (lambda: tls.server_tls(missing, pki.server_key), [missing, "cannot read"]),
        (lambda: tls.server_tls(str(garbage), pki.server_key), [str(garbage), "no PEM certificate"]),
        (lambda: tls.server_tls(str(binary), pki.server_key), [str(binary), "not a PEM file"]),
        (lambda: tls.server_tls(pki.server_cert, str(garbage)), [str(garbage), "no PEM private key"]),
        (lambda: tls.server_tls(pki.server_cert, pki.client_key),
         [pki.client_key, "does not match", pki.server_cert]),
        (lambda: tls.server_tls(pki.server_cert, None), ["--tls-cert needs --tls-key"]),
        (lambda: tls.server_tls(None, pki.server_key), ["--tls-key needs --tls-cert"]),
        (lambda: tls.server_tls(None, None, pki.ca), ["--tls-client-ca needs"]),
        (lambda: tls.server_tls(pki.server_cert, pki.server_key, str(garbage)),
         [str(garbage), "no PEM certificate"]),
        (lambda: tls.client_tls(pki.server_key), [pki.server_key, "no PEM certificate"]),
        (lambda: tls.client_tls(pki.ca, pki.client_cert, None), ["--tls-cert needs --tls-key"]),
        (lambda: tls.client_tls(pki.ca, pki.client_cert, pki.server_key),
         [pki.server_key, "does not match"]),
        (lambda: tls.server_tls(pki.expired_cert, pki.expired_key), [pki.expired_cert, "expired on"]),
        (lambda: tls.server_tls(str(empty), pki.server_key), [str(empty), "the file is empty"]),
        (lambda: tls.server_tls(pki.server_cert, str(empty)), [str(empty), "the file is empty"]),
        (lambda: tls.client_tls(str(empty)), [str(empty), "the file is empty"]),
        (lambda: tls.server_tls("", ""), ["--tls-cert is an empty path"]),
        (lambda: tls.client_tls(""), ["--tls-ca is an empty path"]),
        (lambda: tls.client_tls(pki.ca, pki.expired_cert, pki.expired_key),
         [pki.expired_cert, "expired on"]),
    ]
    for make, words in cases:
        with pytest.raises(tls.TlsError) as info:
            make()
        text = str(info.value)
        assert "\n" not in text
        for w in words:
            assert w in text, (w, text)


def test_credentials_never_show_the_pem_bytes(pki):
    for obj in (tls.server_tls(pki.server_cert, pki.server_key, pki.ca),
                tls.client_tls(pki.ca, pki.client_cert, pki.client_key)):
        assert "PRIVATE KEY" not in repr(obj) and "CERTIFICATE" not in repr(obj)


def test_plaintext_when_nothing_is_given_and_tls_when_asked():
    assert tls.server_tls(None, None) is None
    assert tls.client_tls(None) is None
    assert tls.client_tls(None, enabled=True) == tls.ClientTls()  # the system's roots


def test_client_checks_its_files_before_connecting(pki, tmp_path):
    with pytest.raises(tls.TlsError, match="tls_cert needs tls_key"):
        Client("127.0.0.1:1", tls_ca=pki.ca, tls_cert=pki.client_cert)
    with pytest.raises(ValueError, match="cannot read"):
        Client("127.0.0.1:1", tls_ca=str(tmp_path / "nope.pem"))


def test_client_bad_tls_file_is_a_client_error(tmp_path):
    """Client users catch router.client_errors.ClientError: a bad TLS file is one of them
    (InvalidArgumentError), and still a shard.tls.TlsError and a ValueError."""
    with pytest.raises(errors.InvalidArgumentError) as info:
        Client("127.0.0.1:1", tls_ca=str(tmp_path / "nope.pem"))
    exc = info.value
    assert isinstance(exc, errors.TlsFileError) and isinstance(exc, tls.TlsError)
    assert exc.code.name == "INVALID_ARGUMENT" and "nope.pem" in exc.details


@pytest.mark.parametrize("address,dialled", [
    ("0.0.0.0:7000", "127.0.0.1:7000"), ("[::]:7000", "[::1]:7000"),
    ("[::0]:7000", "[::1]:7000"), ("127.0.0.1:7000", "127.0.0.1:7000"),
    ("[::1]:7000", "[::1]:7000"), ("10.0.0.5:7000", "10.0.0.5:7000"),
    ("shard-0.example:7000", "shard-0.example:7000"), ("unix:/tmp/s.sock", "unix:/tmp/s.sock")])
def test_wildcard_listen_address_is_dialled_as_loopback(address, dialled):
    assert tls.dial_address(address) == dialled


# -- TLS end to end -----------------------------------------------------------------------

def test_every_data_and_admin_call_over_tls(net):
    with client(net.tls_router.address, tls_ca=net.pki.ca) as c:
        assert c.tls
        c.put(b"a", b"1")
        c.put(b"b", b"2", sync=True)
        c.write([(b"c", b"3"), (b"a", None)])
        assert c.get(b"a") is None
        assert c.get(b"b") == b"2"
        assert c.multi_get([b"a", b"b", b"c", b"zz"]) == [None, b"2", b"3", None]
        assert list(c.scan()) == [(b"b", b"2"), (b"c", b"3")]
        stats = c.stats()
        assert "tls" in stats["shards"]
        info = c.cluster_info()
        assert [(s["name"], s["health"]) for s in info["shards"]] == [("tls", "SERVING")]
        c.flush()
    # the shard itself, by its other name (DNS subjectAltName)
    with client(f"localhost:{net.tls_shard.port}", tls_ca=net.pki.ca) as c:
        assert c.get(b"b") == b"2"


def test_mtls_router_and_shard_accept_the_client_certificate(net):
    p = net.pki
    with client(net.mtls_router.address, tls_ca=p.ca, tls_cert=p.client_cert,
                tls_key=p.client_key) as c:
        c.put(b"m", b"1")
        assert c.get(b"m") == b"1"
        assert c.cluster_info()["shards"][0]["health"] == "SERVING"
    with client(net.mtls_shard.address, tls_ca=p.ca, tls_cert=p.client_cert,
                tls_key=p.client_key) as c:
        assert c.get(b"m") == b"1"


@pytest.mark.parametrize("where", ["router", "shard"])
def test_mtls_refuses_clients_without_an_accepted_certificate(net, where):
    p = net.pki
    address = (net.mtls_router if where == "router" else net.mtls_shard).address
    assert "Socket closed" in assert_unavailable(address, tls_ca=p.ca)  # no certificate
    assert_unavailable(address, tls_ca=p.ca, tls_cert=p.other_client_cert,
                       tls_key=p.other_client_key)  # signed by another CA
    assert_unavailable(address)  # plaintext


def test_handshake_failures_are_unavailable(net):
    p = net.pki
    details = assert_unavailable(net.tls_router.address, tls_ca=p.other_ca)
    assert "CERTIFICATE_VERIFY_FAILED" in details
    assert tls.looks_like_handshake_failure(details)
    details = assert_unavailable(net.tls_router.address)  # plaintext client, TLS server
    assert tls.looks_like_handshake_failure(details)
    details = assert_unavailable(net.plain.address, tls_ca=p.ca)  # TLS client, plaintext server
    assert "WRONG_VERSION_NUMBER" in details
    assert tls.looks_like_handshake_failure(details)
    # tls=True: TLS verified by the system's roots, which do not hold the test CA
    details = assert_unavailable(net.tls_router.address, tls=True)
    assert "CERTIFICATE_VERIFY_FAILED" in details
    # a server that is not there is not a TLS problem
    details = assert_unavailable("127.0.0.1:1", tls_ca=p.ca)
    assert not tls.looks_like_handshake_failure(details)


def test_router_without_a_client_certificate_cannot_reach_an_mtls_shard(net, procs, tmp_path):
    p = net.pki
    map_path = write_cluster_map(str(tmp_path / "map.toml"), [net.mtls_shard])
    r = start_router_process(procs, map_path, name="nocert-router",
                             extra=("--shard-tls-ca", p.ca))
    with client(r.address) as c:
        with pytest.raises(errors.UnavailableError, match="shard mtls at .* is unavailable"):
            c.get(b"k")
        assert c.cluster_info()["shards"][0]["health"] != "SERVING"


def test_health_probe_uses_the_credentials(net):
    p = net.pki
    assert health_probe.probe(net.tls_shard.address, 5, tls=tls.client_tls(p.ca)) == "SERVING"
    assert health_probe.probe(net.tls_shard.address, 5) == health_probe.UNREACHABLE
    assert health_probe.probe(net.mtls_shard.address, 5, tls=tls.client_tls(p.ca)) \
        == health_probe.UNREACHABLE
    assert health_probe.probe(net.mtls_shard.address, 5, tls=tls.client_tls(
        p.ca, p.client_cert, p.client_key)) == "SERVING"


# -- the CLI --------------------------------------------------------------------------------

def sievekv(tmp_path, *argv, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SIEVEKV_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "router.cli", *argv], capture_output=True,
                          text=True, env=e, cwd=str(tmp_path), timeout=120)


def test_cli_over_tls_with_options_and_environment(net, tmp_path):
    p = net.pki
    addr = net.tls_router.address
    r = sievekv(tmp_path, "put", "--router", addr, "--tls-ca", p.ca, "cli", "v")
    assert r.returncode == 0, r.stderr
    r = sievekv(tmp_path, "get", "--router", addr, "cli", env={"SIEVEKV_TLS_CA": p.ca})
    assert (r.returncode, r.stdout) == (0, "v\n"), r.stderr
    r = sievekv(tmp_path, "stats", "--json", "--router", addr, env={"SIEVEKV_TLS_CA": p.ca})
    assert r.returncode == 0, r.stderr
    mtls = ("--tls-ca", p.ca, "--tls-cert", p.client_cert, "--tls-key", p.client_key)
    r = sievekv(tmp_path, "--router", net.mtls_router.address, *mtls, "get", "m")
    assert r.returncode in (0, 5), r.stderr


def test_cli_bench_client_processes_use_tls(net, tmp_path):
    p = net.pki
    r = sievekv(tmp_path, "bench", "--router", net.mtls_router.address, "--clients", "1",
                "--seconds", "0.5", "--keys", "100", "--op", "mixed", "--json", "-q",
                env={"SIEVEKV_TLS_CA": p.ca, "SIEVEKV_TLS_CERT": p.client_cert,
                     "SIEVEKV_TLS_KEY": p.client_key})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["total"]["calls"] > 0 and doc["total"]["errors"] == {}, doc


@pytest.mark.parametrize("case", ["plaintext", "wrong-ca", "tls-to-plaintext", "no-client-cert"])
def test_cli_handshake_failure_is_one_line_and_exit_3(net, tmp_path, case):
    p = net.pki
    router, flags, words = {
        "plaintext": (net.tls_router, (), "may require TLS"),
        "wrong-ca": (net.tls_router, ("--tls-ca", p.other_ca), "not signed by the --tls-ca CA"),
        "tls-to-plaintext": (net.plain, ("--tls-ca", p.ca), "does not speak TLS"),
        "no-client-cert": (net.mtls_router, ("--tls-ca", p.ca), "client certificate"),
    }[case]
    for cmd in (("get", "k"), ("stats",)):  # a Client call, an Admin call (router/cli/rpc.py)
        r = sievekv(tmp_path, *cmd, "--router", router.address, "--timeout", "5", *flags)
        assert r.returncode == 3, (r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("sievekv: error: "), r.stderr
        assert "TLS handshake failed?" in lines[0] and words in lines[0], lines[0]


def test_cli_hint_when_the_certificate_does_not_name_the_host(pki, procs, tmp_path):
    shard = start_shard_process(procs, str(tmp_path / "d"), name="elsewhere",
                                extra=("--tls-cert", pki.elsewhere_cert, "--tls-key",
                                       pki.elsewhere_key))
    r = sievekv(tmp_path, "stats", "--router", shard.address, "--tls-ca", pki.ca,
                "--timeout", "5")
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Hostname Verification" in lines[0], r.stderr
    assert "does not name the host dialled" in lines[0], r.stderr


def test_cli_bad_tls_file_is_a_usage_error(net, tmp_path):
    r = sievekv(tmp_path, "get", "k", "--router", net.tls_router.address,
                env={"SIEVEKV_TLS_CA": str(tmp_path / "nope.pem")})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"sievekv: error: TLS CA {tmp_path / 'nope.pem'}: cannot read: No such file or directory"]
    r = sievekv(tmp_path, "get", "k", "--router", net.tls_router.address,
                "--tls-ca", net.pki.ca, "--tls-cert", net.pki.client_cert)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["sievekv: error: --tls-cert needs --tls-key too (a "
                                     "certificate and its private key)"]
    r = sievekv(tmp_path, "get", "k", "--router", net.tls_router.address, "--tls-ca", "")
    assert (r.returncode, r.stderr) == (2, "sievekv: error: --tls-ca is an empty path\n")


@pytest.fixture
def no_cli_tls():
    """rpc's per-command TLS state, reset after the test (other tests call rpc directly)."""
    rpc.use_tls(None)
    try:
        yield
    finally:
        rpc.use_tls(None)


def test_tls_hint_only_for_handshake_failures(no_cli_tls):
    assert rpc.tls_hint("get: UNAVAILABLE: failed to connect to all addresses; last error: "
                        "UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
                        "Connection refused") == ""
    assert "--shard-tls" in rpc.tls_hint(
        "get: UNAVAILABLE: shard s0 at 127.0.0.1:5 is unavailable: failed to connect to all "
        "addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:5: Socket closed")


_VERIFY_FAILED = ("get: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
                  "ipv4:127.0.0.1:5: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
                  "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: ")


@pytest.mark.parametrize("reason,words", [
    ("certificate has expired", "has expired"),
    ("certificate is not yet valid", "not valid yet"),
    ("unable to get local issuer certificate", "not signed by the --tls-ca CA")])
def test_tls_hint_tells_dates_from_a_wrong_ca(no_cli_tls, reason, words):
    hint = rpc.tls_hint(_VERIFY_FAILED + reason)
    assert words in hint, hint
    assert reason == "unable to get local issuer certificate" or "not signed" not in hint


def test_tls_failure_makes_a_call_host_mismatch_exit_3(no_cli_tls):
    from router.cli.exit_codes import ERROR, UNREACHABLE

    line = "get: UNAUTHENTICATED: call host does not match SSL server name"
    message, code = rpc.tls_failure(line, ERROR)
    assert code == UNREACHABLE and "subjectAltName" in message, message
    other = "get: UNAUTHENTICATED: not allowed"
    assert rpc.tls_failure(other, ERROR) == (other, ERROR)


def test_rpc_tls_is_loaded_once_from_many_threads(pki, no_cli_tls):
    """cluster status calls rpc.tls() from worker threads: one object, read once."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    rpc.use_tls(argparse.Namespace(tls_ca=pki.ca))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: rpc.tls(), range(64)))
    assert got[0] is not None and all(g is got[0] for g in got)


# -- bad startup inputs ---------------------------------------------------------------------

def _run_to_exit(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a server command line that must exit by itself; afterwards nothing of its process
    group may be left."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            left = True
        except ProcessLookupError:
            left = False
        proc.wait(10)
    assert not left, f"{argv[2]} left processes running"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _bad_inputs(p: Pki, tmp_path) -> list[tuple[str, tuple[str, ...], str]]:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    missing = str(tmp_path / "missing.pem")
    return [
        ("missing", ("--tls-cert", missing, "--tls-key", p.server_key), missing),
        ("garbage", ("--tls-cert", str(garbage), "--tls-key", p.server_key), str(garbage)),
        ("mismatch", ("--tls-cert", p.server_cert, "--tls-key", p.client_key), p.client_key),
        ("no-key", ("--tls-cert", p.server_cert), "--tls-key"),
        ("bad-client-ca", (*_server_flags(p), "--tls-client-ca", p.server_key), p.server_key),
        ("expired", ("--tls-cert", p.expired_cert, "--tls-key", p.expired_key), "expired on"),
        ("empty-options", ("--tls-cert", "", "--tls-key", ""), "--tls-cert is an empty path"),
    ]


def test_shard_refuses_bad_tls_files_at_startup(pki, tmp_path):
    for name, flags, words in _bad_inputs(pki, tmp_path):
        data = tmp_path / f"data-{name}"
        r = _run_to_exit([sys.executable, "-m", "shard", "--data-dir", str(data),
                          "--listen", "127.0.0.1:0", *flags])
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and words in lines[0], (name, r.stderr)
        assert not data.exists(), name  # checked before the engine opened anything


@pytest.mark.parametrize("processes", [1, 2])
def test_router_refuses_bad_tls_files_at_startup(pki, tmp_path, processes):
    map_path = tmp_path / "map.toml"
    map_path.write_text('[[shards]]\nname = "s"\naddress = "127.0.0.1:1"\n')
    cases = _bad_inputs(pki, tmp_path) + [
        ("shard-ca-missing", ("--shard-tls-ca", str(tmp_path / "nope.pem")),
         str(tmp_path / "nope.pem")),
        ("shard-cert-no-key", ("--shard-tls-ca", pki.ca, "--shard-tls-cert", pki.client_cert),
         "--shard-tls-cert needs --shard-tls-key"),
        ("shard-key-mismatch", ("--shard-tls-cert", pki.client_cert, "--shard-tls-key",
                                pki.server_key), pki.server_key),
    ]
    for name, flags, words in cases:
        r = _run_to_exit([sys.executable, "-m", "router", "--cluster-map", str(map_path),
                          "--listen", "127.0.0.1:0", "--processes", str(processes), *flags])
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and words in lines[0], (name, r.stderr)


# -- the local cluster ([tls] of the config) ------------------------------------------------

def cluster_conf(tmp_path, *, shards: int = 2, start_timeout: float = 30.0,
                 router_host: str = "127.0.0.1", **tls_keys) -> str:
    """A local cluster config in ``tmp_path`` (port 0 everywhere) with ``[tls]`` = tls_keys."""
    conf = tmp_path / "cluster.toml"
    conf.write_text("\n".join([
        "[cluster]", 'data_dir = "data"', "[router]", f'listen = "{router_host}:0"',
        "[shards]", f"count = {shards}", "base_port = 0", "[supervisor]",
        f"start_timeout = {start_timeout}", "stop_timeout = 10.0", "[tls]",
        *[f'{k} = "{v}"' for k, v in tls_keys.items()], ""]))
    return str(conf)


def stop_cluster(tmp_path, conf: str) -> None:
    """`cluster stop`, then SIGKILL whatever the state file still records alive."""
    sievekv(tmp_path, "cluster", "stop", "--config", conf, "--timeout", "5")
    try:
        doc = cs.read_state(str(tmp_path / "data"))
    except cs.StateError:
        return
    for _, pid, ct in cs.recorded_pids(doc):
        if cs.pid_alive(pid, ct):
            os.kill(pid, signal.SIGKILL)


def test_local_cluster_with_mutual_tls(pki, tmp_path):
    """[tls] with client_ca: the supervisor starts shards and router with TLS, probes them
    with the client certificate, and the CLI's calls use the recorded [tls] by themselves."""
    # cert is also the client certificate of the router, the supervisor and the CLI: it
    # must allow clientAuth as well as serverAuth
    conf = cluster_conf(tmp_path, cert=pki.node_cert, key=pki.node_key, ca=pki.ca,
                         client_ca=pki.ca)
    try:
        r = sievekv(tmp_path, "cluster", "start", "--config", conf, "-q")
        assert r.returncode == 0, r.stderr
        env = {"SIEVEKV_CONFIG": conf}
        assert sievekv(tmp_path, "put", "a", "1", env=env).returncode == 0
        r = sievekv(tmp_path, "get", "a", env=env)
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
        r = sievekv(tmp_path, "cluster", "status", "--json", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert {row["health"] for row in doc["processes"]} == {"SERVING"}, doc
        # a plaintext client of the cluster's router is refused; with the files it is served
        router = cs.read_state(str(tmp_path / "data"))["router_address"]
        r = sievekv(tmp_path, "get", "a", "--router", router, "--timeout", "5")
        assert r.returncode == 3 and "TLS handshake failed?" in r.stderr, r.stderr
        r = sievekv(tmp_path, "get", "a", "--router", router, "--tls-ca", pki.ca,
                    "--tls-cert", pki.client_cert, "--tls-key", pki.client_key)
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
        # `export SIEVEKV_ROUTER=$(sievekv cluster start -q)`: still the cluster's own files
        env["SIEVEKV_ROUTER"] = router
        r = sievekv(tmp_path, "get", "a", env=env)
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
        r = sievekv(tmp_path, "cluster", "status", "--json", env=env)
        assert {row["health"] for row in json.loads(r.stdout)["processes"]} == {"SERVING"}
    finally:
        stop_cluster(tmp_path, conf)


def test_local_cluster_refuses_unusable_tls_files(pki, tmp_path):
    conf = cluster_conf(tmp_path, cert=pki.server_cert, key=pki.client_key, ca=pki.ca)
    try:
        r = sievekv(tmp_path, "cluster", "start", "--config", conf, "-q")
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and "does not match" in r.stderr, r.stderr
    finally:
        stop_cluster(tmp_path, conf)


def test_local_cluster_whose_certificate_the_ca_did_not_sign_names_tls(pki, tmp_path):
    conf = cluster_conf(tmp_path, cert=pki.other_server_cert, key=pki.other_server_key,
                         ca=pki.ca)
    text = open(conf).read().replace("start_timeout = 30.0", "start_timeout = 3.0")
    open(conf, "w").write(text)
    try:
        r = sievekv(tmp_path, "cluster", "start", "--config", conf, "-q")
        assert r.returncode != 0
        assert "not SERVING within 3s (TLS on: is its certificate signed by [tls] ca" in r.stderr, \
            r.stderr
    finally:
        stop_cluster(tmp_path, conf)
