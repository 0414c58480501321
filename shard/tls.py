"""TLS for every gRPC hop: PEM files read and checked up front, then gRPC credentials.

- :class:`ServerTls` (``--tls-cert``, ``--tls-key``, optional ``--tls-client-ca``): what a
  shard or router serves with. With ``client_ca`` the server requires a client certificate
  signed by it (mutual TLS) and refuses connections without one during the handshake.
- :class:`ClientTls` (``ca``, optional ``cert`` + ``key``): what a channel to a TLS server
  uses: ``ca`` verifies the server (None: the system's roots), ``cert``/``key`` are the
  client certificate that a server requiring mTLS checks.

:func:`server_tls` and :func:`client_tls` read the files (plain reads; the bytes are what gRPC
gets) and check them with the stdlib :mod:`ssl` module before any server or channel exists:
an option given as "", a missing, unreadable or empty file, a file with no PEM certificate or
key, a key that does not belong to its certificate, a certificate without its key, or an own
certificate that has expired or is not valid yet raise :class:`TlsError` (one line naming
the file and what is wrong). gRPC itself would only fail later, per connection, with a
message that names no file. Not checked: that a CA file holds a CA (a self-signed server
certificate is a valid trust anchor for itself) and that a certificate names its host.

The hostname a client checks is the host of the address it dials (``127.0.0.1`` in a
cluster map needs an IP subjectAltName, ``shard-0.example`` a DNS one). Files are read once:
rotating a certificate needs a restart. The Prometheus metrics endpoints stay plain HTTP.
Immutable objects; thread-safe.
"""

from __future__ import annotations

import ipaddress
import ssl
import time
from dataclasses import dataclass, field

import grpc

from engine.errors import InvalidArgumentError


class TlsError(InvalidArgumentError):
    """A TLS file cannot be used. ``str()`` is one line naming the file."""


# The PEM bytes are left out of repr(): a private key must never reach a log line or a
# traceback.

@dataclass(frozen=True)
class ServerTls:
    """PEM bytes: ``cert`` (chain), ``key``, ``client_ca`` (set: client certificates signed
    by it are required)."""

    cert: bytes = field(repr=False)
    key: bytes = field(repr=False)
    client_ca: bytes | None = field(default=None, repr=False)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


@dataclass(frozen=True)
class ClientTls:
    """PEM bytes: ``ca`` (None: the system's roots), ``cert`` (chain) and ``key`` (the
    client certificate, for servers that require one)."""

    ca: bytes | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def _pem_text(data: bytes, path: str, what: str) -> str:
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise TlsError(f"{what} {path}: not a PEM file (binary data; DER is not supported)") from None


def _read_certs(path: str, what: str) -> bytes:
    """The bytes of ``path``, which must hold at least one PEM certificate."""
    data = _read(path, what)
    text = _pem_text(data, path, what)
    if not text.strip():
        raise TlsError(f"{what} {path}: the file is empty")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        if "BEGIN CERTIFICATE" not in text:
            raise TlsError(f"{what} {path}: no PEM certificate in it") from None
        raise TlsError(f"{what} {path}: bad PEM certificate ({_reason(exc)})") from None
    return data


def _check_dates(path: str, what: str) -> None:
    """Raise TlsError if the first certificate in ``path`` has expired or is not valid yet
    (every handshake would fail). Uses the stdlib's ``ssl._ssl._test_decode_cert`` (CPython,
    not public API); skipped where it is missing or cannot read the file. For a server's or
    a client's own certificate only: a CA bundle may hold expired CAs beside valid ones."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return
    try:
        info = decode(path)
        not_before = ssl.cert_time_to_seconds(info["notBefore"])
        not_after = ssl.cert_time_to_seconds(info["notAfter"])
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return
    now = time.time()
    if now > not_after:
        raise TlsError(f"{what} {path}: expired on {info['notAfter']}")
    if now < not_before:
        raise TlsError(f"{what} {path}: not valid before {info['notBefore']}")


def _read_key(path: str, what: str) -> bytes:
    data = _read(path, what)
    text = _pem_text(data, path, what)
    if not text.strip():
        raise TlsError(f"{what} {path}: the file is empty")
    if "ENCRYPTED PRIVATE KEY" in text or "Proc-Type: 4,ENCRYPTED" in text:
        raise TlsError(f"{what} {path}: the key is encrypted (gRPC needs it without a passphrase)")
    if "PRIVATE KEY-----" not in text:
        raise TlsError(f"{what} {path}: no PEM private key in it")
    return data


def _reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or str(exc)


def _check_pair(cert_path: str, key_path: str) -> None:
    """Raise TlsError unless ``key_path`` is the private key of ``cert_path``'s certificate."""
    def no_password():
        raise TlsError(f"TLS key {key_path}: the key is encrypted")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path, no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"TLS key {key_path} does not match the certificate "
                           f"{cert_path}") from None
        raise TlsError(f"TLS key {key_path}: cannot load it with the certificate {cert_path} "
                       f"({_reason(exc)})") from None
    except OSError as exc:  # the file changed between the reads
        raise TlsError(f"TLS key {key_path}: cannot read: {exc.strerror or exc}") from None


def _no_empty(paths: tuple, flags: tuple) -> None:
    """An option given as "" is a mistake (an unset variable in a unit file?), not "off"."""
    for path, flag in zip(paths, flags):
        if path == "":
            raise TlsError(f"{flag} is an empty path")


def _pair(cert: str | None, key: str | None, cert_flag: str, key_flag: str) -> None:
    if bool(cert) != bool(key):
        given, missing = (cert_flag, key_flag) if cert else (key_flag, cert_flag)
        raise TlsError(f"{given} needs {missing} too (a certificate and its private key)")


def server_tls(cert: str | None, key: str | None, client_ca: str | None = None, *,
               flags: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-client-ca")
               ) -> ServerTls | None:
    """The checked ServerTls of these paths, or None (plaintext) when none is given.
    ``flags`` name the options in messages. Raises TlsError (see the module doc); an empty
    string is an error, not "off"."""
    _no_empty((cert, key, client_ca), flags)
    _pair(cert, key, flags[0], flags[1])
    if not cert:
        if client_ca:
            raise TlsError(f"{flags[2]} needs {flags[0]} and {flags[1]} (mTLS is TLS with "
                           f"client certificates)")
        return None
    cert_bytes = _read_certs(cert, "TLS certificate")
    _check_dates(cert, "TLS certificate")
    key_bytes = _read_key(key, "TLS key")
    _check_pair(cert, key)
    ca_bytes = _read_certs(client_ca, "TLS client CA") if client_ca else None
    return ServerTls(cert_bytes, key_bytes, ca_bytes)


def client_tls(ca: str | None, cert: str | None = None, key: str | None = None, *,
               enabled: bool = False,
               flags: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key")
               ) -> ClientTls | None:
    """The checked ClientTls of these paths, or None (plaintext) when none is given and not
    ``enabled`` (TLS verified by the system's roots). Raises TlsError; an empty string is an
    error, not "off"."""
    _no_empty((ca, cert, key), flags)
    _pair(cert, key, flags[1], flags[2])
    if not (ca or cert or enabled):
        return None
    ca_bytes = _read_certs(ca, "TLS CA") if ca else None
    if not cert:
        return ClientTls(ca_bytes)
    cert_bytes = _read_certs(cert, "TLS certificate")
    _check_dates(cert, "TLS certificate")
    key_bytes = _read_key(key, "TLS key")
    _check_pair(cert, key)
    return ClientTls(ca_bytes, cert_bytes, key_bytes)


def add_port(server: grpc.Server, address: str, tls: ServerTls | None) -> int:
    """``server.add_secure_port`` with ``tls``, else ``add_insecure_port``; the bound port
    (0 if it could not be bound). May raise RuntimeError as gRPC does."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.credentials())


def dial_address(address: str) -> str:
    """The address to dial for ``address`` (HOST:PORT): a wildcard (unspecified) host
    (``0.0.0.0``, ``[::]``), which a server may listen on but which names no host, is
    dialled as the loopback address of its family (``127.0.0.1``, ``[::1]``); any other
    address is returned as it is. Connecting to the wildcard already reaches this host, so
    a plaintext call goes to the same server either way; over TLS, the loopback address is
    also the host that the server's certificate must name (an IP subjectAltName), since no
    certificate names 0.0.0.0. This is how a local cluster whose [router] listen (or a
    cluster map's shard address) is a wildcard is reached."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]")
                                  else host)
    except ValueError:
        return address  # a name, or no host at all
    if not ip.is_unspecified:
        return address
    return f"127.0.0.1:{port}" if ip.version == 4 else f"[::1]:{port}"


def channel(address: str, options=(), tls: ClientTls | None = None) -> grpc.Channel:
    """A channel to ``address`` (a wildcard host is dialled as loopback: :func:`dial_address`):
    TLS with ``tls``, else plaintext."""
    address = dial_address(address)
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, tls.credentials(), options=list(options))


HANDSHAKE_WORDS = ("tls handshake failed", "ssl_error", "socket closed",
                   "hostname verification")
"""Words of gRPC's UNAVAILABLE details when a connection failed in the TLS handshake, as
grpc 1.85 reports them (tests/test_tls.py): a TLS client sees "Tls handshake failed
(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: ...CERTIFICATE_VERIFY_FAILED" (wrong CA) or
"...WRONG_VERSION_NUMBER" (the server is plaintext), or "Custom verification check failed
with error: UNAUTHENTICATED: Hostname Verification Check failed." (the certificate does not
name the host dialled); a plaintext client of a TLS server, and
a client without an accepted certificate of an mTLS server, see only "Socket closed" (the
server hung up during the handshake). A server that is down reads "Connection refused"."""


def looks_like_handshake_failure(details: str | None) -> bool:
    """Whether UNAVAILABLE ``details`` suggest a TLS mismatch (a wrong CA, TLS against
    plaintext or the reverse, a missing client certificate) rather than a server that is
    down ("Connection refused")."""
    text = (details or "").lower()
    return any(w in text for w in HANDSHAKE_WORDS)
