"""Direct Admin calls to one server (a shard or the router) for the CLI's reports.

``cluster status`` asks each shard itself (the router may be the process that is down);
``filters`` and ``stats`` ask the router, which fans out. Each call opens and closes its own
channel; a failure raises grpc.RpcError for the caller to map (exit_codes.from_rpc_error).

TLS: the CLI's ``--tls-ca``/``--tls-cert``/``--tls-key`` (or ``$SIEVEKV_TLS_CA``,
``$SIEVEKV_TLS_CERT``, ``$SIEVEKV_TLS_KEY``) are set once per command (:func:`use_tls`,
from router/cli/app.py) and apply to every RPC the command makes: these calls, the data
commands' and bench's :class:`router.client.Client` (:func:`client_tls_args`) and the health
probes of ``cluster status`` (:func:`tls`). A file that cannot be used is a CliError (USAGE)
at the first call; :func:`tls_hint` explains an UNAVAILABLE that was a TLS handshake failure.
"""

from __future__ import annotations

import json
import os
import threading

from shard.tls import ClientTls, TlsError, channel, client_tls, looks_like_handshake_failure
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pb_grpc

from .exit_codes import UNREACHABLE, USAGE, CliError

TLS_ENV = {"ca": "SIEVEKV_TLS_CA", "cert": "SIEVEKV_TLS_CERT", "key": "SIEVEKV_TLS_KEY"}
# The command's TLS settings (one command per process; set by use_tls from the main thread).
_tls_paths: dict[str, str | None] = {"ca": None, "cert": None, "key": None}
_tls_flags: dict[str, str] = {}  # part -> how it was given: "--tls-ca" or "$SIEVEKV_TLS_CA"
_tls_args: list = [None]  # the command's arguments, for the local cluster's [tls]
_tls_loaded: list = []  # [ClientTls | None] once loaded
_tls_lock = threading.Lock()  # tls() may run in several threads at once (cluster status)


def use_tls(args) -> None:
    """Take the TLS paths of this command: ``--tls-X`` from ``args``, else ``$SIEVEKV_TLS_X``,
    else (none of them given) the ``[tls]`` of the local cluster's config recorded in its state
    file (read at the first call; not for a router other than that cluster's)."""
    for part, env in TLS_ENV.items():
        given = getattr(args, f"tls_{part}", None)  # "" stays: client_tls refuses it
        _tls_paths[part] = given if given is not None else os.environ.get(env) or None
        _tls_flags[part] = f"${env}" if given is None and os.environ.get(env) else f"--tls-{part}"
    _tls_args[0] = args
    _tls_loaded.clear()
    if args is not None and not any(_tls_paths.values()) and _takes_router(args):
        # The first call will look for the local cluster's [tls] (_local_cluster_tls), which
        # needs the config: one that cannot be loaded is a usage error now, --router or not
        # (docs/cli.md), as for the commands that read it for other reasons. Until session 20
        # the report commands dropped it there and went on.
        from . import target

        target.data_dir(args)


def _takes_router(args) -> bool:
    parser = getattr(args, "command_parser", None)
    return parser is not None and any(a.dest == "router" for a in parser._actions)


def _local_cluster_tls(args) -> None:
    """Fill the paths from the running local cluster's [tls] (see use_tls), if it has TLS."""
    from .. import cluster_state as cs
    from . import target

    if args is None:
        return
    try:
        doc = cs.read_state(target.data_dir(args))
    except (cs.StateError, CliError):  # a bad config was refused by use_tls already
        return
    # A command that calls a router given by --router / $SIEVEKV_ROUTER uses the local
    # cluster's files only when it is that cluster's router (`export SIEVEKV_ROUTER=$(sievekv
    # cluster start -q)`); `cluster status` probes the local processes whatever it says.
    router = getattr(args, "router", None) or os.environ.get("SIEVEKV_ROUTER")
    if _takes_router(args) and router and router != doc.get("router_address"):
        return
    t = doc.get("config", {}).get("tls") or {}
    if not t.get("cert") or not t.get("ca"):
        return
    mutual = bool(t.get("client_ca"))
    _tls_paths.update(ca=t["ca"], cert=t["cert"] if mutual else None,
                      key=t["key"] if mutual else None)
    _tls_flags.update(ca="[tls] ca", cert="[tls] cert", key="[tls] key")


def _flag(part: str) -> str:
    return _tls_flags.get(part, f"--tls-{part}")


def tls() -> ClientTls | None:
    """The command's client credentials (None: plaintext), read and checked once; a file that
    cannot be used raises CliError (USAGE) naming it (again at each call).

    Thread-safe: the first call reads the files under a lock, every call returns the same
    object (``cluster status`` probes its processes from worker threads). :func:`use_tls`
    is not: call it once, from the main thread, before any thread calls this."""
    with _tls_lock:
        if not _tls_loaded:
            if not any(_tls_paths.values()):
                _local_cluster_tls(_tls_args[0])
            try:
                creds = client_tls(_tls_paths["ca"], _tls_paths["cert"], _tls_paths["key"],
                                   flags=(_flag("ca"), _flag("cert"), _flag("key")))
            except TlsError as exc:
                raise CliError(str(exc), USAGE) from None
            _tls_loaded.append(creds)
        return _tls_loaded[0]


def client_tls_args() -> dict:
    """Keyword arguments of router.client.Client for the command's TLS (checked first)."""
    tls()
    return {"tls_ca": _tls_paths["ca"], "tls_cert": _tls_paths["cert"],
            "tls_key": _tls_paths["key"]}


# gRPC's UNAUTHENTICATED details when the handshake passed but the server's certificate
# does not name the host of the call: a certificate without subjectAltName (CN only) gets here
# (grpc 1.85; tests/test_review_tls.py).
CALL_HOST_WORDS = "call host does not match ssl server name"


def tls_failure(message: str, code: int) -> tuple[str, int]:
    """The CLI's error line and exit code for a failed command whose one line is ``message``
    and exit code ``code``: a TLS failure gets :func:`tls_hint`'s hint and exit code
    UNREACHABLE (a TLS mismatch is a cluster the command cannot talk to); anything else is
    returned as it is."""
    if code == UNREACHABLE or CALL_HOST_WORDS in message.lower():
        hint = tls_hint(message)
        if hint:
            return message + hint, UNREACHABLE
    return message, code


def tls_hint(details: str) -> str:
    """A hint to append to an UNAVAILABLE whose ``details`` read like a TLS handshake failure
    (shard/tls.py, HANDSHAKE_WORDS), or to gRPC's UNAUTHENTICATED "call host does not match
    SSL server name"; "" otherwise. The words checked are OpenSSL's and gRPC's (grpc 1.85):
    "certificate has expired" and "certificate is not yet valid" are dates (the server reads
    its files once, so a certificate can expire while it serves), any other
    CERTIFICATE_VERIFY_FAILED is a certificate not signed by the CA used."""
    text = details.lower()
    if CALL_HOST_WORDS in text:
        return (" (TLS: the server's certificate does not name the host dialled in a "
                "subjectAltName: give it an IP subjectAltName for an IP address, a DNS one "
                "for a name)")
    if not looks_like_handshake_failure(details):
        return ""
    with _tls_lock:
        using = _tls_loaded[0] if _tls_loaded else None
    ca = _flag("ca")
    if "shard " in text and " is unavailable: " in text:  # the router's call to a shard failed
        why = ("between the router and that shard: check the router's --shard-tls-* options "
               "against the shard's --tls-* options")
    elif "wrong_version_number" in text:
        why = "the server does not speak TLS (drop --tls-ca/$SIEVEKV_TLS_CA?)"
    elif "certificate has expired" in text:
        why = ("the server's certificate has expired (or this host's clock is ahead): a "
               "server reads its certificate once, at start; renew it and restart the server")
    elif "not yet valid" in text:
        why = ("the server's certificate is not valid yet: check the clocks of this host and "
               "of the server")
    elif "certificate_verify_failed" in text:
        why = f"the server's certificate is not signed by the {ca} CA"
    elif "hostname verification" in text:
        why = ("the server's certificate does not name the host dialled (its subjectAltName "
               "needs that IP address or DNS name)")
    elif using is None:
        why = "the server may require TLS: give --tls-ca (or $SIEVEKV_TLS_CA)"
    elif using.cert is None:
        why = ("the server may require a client certificate (mutual TLS): give --tls-cert and "
               "--tls-key")
    else:
        why = "the server may have refused the client certificate (not signed by its client CA)"
    return f" (TLS handshake failed? {why})"


MAX_MESSAGE = 64 << 20  # reports of many tables can be large
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.enable_retries", 0)]

_REQUESTS = {
    "Stats": pb.StatsRequest,
    "FilterReport": pb.FilterReportRequest,
    "Flush": pb.FlushRequest,
    "Compact": pb.CompactRequest,
    "Verify": pb.VerifyRequest,
    "Checkpoint": pb.CheckpointRequest,
    "ClusterInfo": pb.ClusterInfoRequest,
}


def admin_call(address: str, method: str, timeout: float, request=None):
    """Call Admin.<method> on ``address`` (with ``request``, else an empty one); returns
    (response, trailing_metadata)."""
    ch = channel(address, _OPTIONS, tls())
    try:
        stub = pb_grpc.AdminStub(ch)
        rpc = getattr(stub, method)
        resp, call = rpc.with_call(request if request is not None else _REQUESTS[method](),
                                  timeout=timeout)
        return resp, call.trailing_metadata()
    finally:
        ch.close()


def report_json(address: str, method: str, timeout: float) -> dict:
    """Stats or FilterReport as the server's combined JSON:
    ``{"shards": {name: report}, "totals": {...}, "errors": {name: message}}``, with
    ``"sections"`` added: per shard ``{"address", "ok", "code", "error"}``."""
    resp, _ = admin_call(address, method, timeout)
    doc = json.loads(resp.json) if resp.json else {"shards": {}, "totals": {}, "errors": {}}
    doc["sections"] = {s.shard: {"address": s.address, "ok": s.ok, "code": s.code,
                                 "error": s.error} for s in resp.shards}
    for s in resp.shards:
        if s.ok and s.shard not in doc.get("shards", {}) and s.json:
            doc.setdefault("shards", {})[s.shard] = json.loads(s.json)
    return doc
