"""Test certificates made with ``cryptography``: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, a "node" certificate for both uses (a local cluster's
[tls] cert with client_ca), and a second, unrelated CA (with its own server and client
certificates).

``make_pki(directory) -> Pki`` writes PEM files and returns their paths. Keys are EC P-256
(fast to make); certificates are valid from an hour ago for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: str  # CA certificate that signed server and client
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # an unrelated CA
    other_server_cert: str  # signed by other_ca, SAN 127.0.0.1
    other_server_key: str
    other_client_cert: str  # signed by other_ca
    other_client_key: str
    node_cert: str  # signed by ca, SAN 127.0.0.1/localhost, for server and client use
    node_key: str
    expired_cert: str  # like server_cert, valid until a day ago
    expired_key: str
    elsewhere_cert: str  # like server_cert, but for DNS:elsewhere.example only
    elsewhere_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name, public_key, expired: bool = False):
    now = datetime.datetime.now(datetime.timezone.utc)
    if expired:
        now -= datetime.timedelta(days=2)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1)))


def _san(host: str):
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(directory: str, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(name, _name(name), key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = _write(os.path.join(directory, f"{name}.pem"), cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def make_leaf(directory: str, name: str, ca_cert, ca_key, *, server: bool,
              client: bool = False, expired: bool = False,
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[str, str]:
    """(cert path, key path) of a certificate for ``name`` signed by the CA: ``server`` (SAN
    ``hosts``, extendedKeyUsage serverAuth, plus clientAuth with ``client``)
    or a client certificate (clientAuth only). ``expired``: valid until a day ago."""
    key = ec.generate_private_key(ec.SECP256R1())
    b = _builder(name, ca_cert.subject, key.public_key(), expired).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]),
            critical=False).add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])),
            critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    return (_write(os.path.join(directory, f"{name}.pem"), cert.public_bytes(serialization.Encoding.PEM)),
            _write(os.path.join(directory, f"{name}-key.pem"), _key_pem(key)))


def make_pki(directory: str) -> Pki:
    os.makedirs(directory, exist_ok=True)
    ca_cert, ca_key, ca = make_ca(directory, "ca")
    server_cert, server_key = make_leaf(directory, "server", ca_cert, ca_key, server=True)
    client_cert, client_key = make_leaf(directory, "client", ca_cert, ca_key, server=False)
    other_cert, other_key, other_ca = make_ca(directory, "other-ca")
    o_server_cert, o_server_key = make_leaf(directory, "other-server", other_cert, other_key, server=True)
    o_client_cert, o_client_key = make_leaf(directory, "other-client", other_cert, other_key, server=False)
    node_cert, node_key = make_leaf(directory, "node", ca_cert, ca_key, server=True, client=True)
    expired_cert, expired_key = make_leaf(directory, "expired", ca_cert, ca_key, server=True,
                                          expired=True)
    elsewhere_cert, elsewhere_key = make_leaf(directory, "elsewhere", ca_cert, ca_key,
                                              server=True, hosts=("elsewhere.example",))
    return Pki(ca, server_cert, server_key, client_cert, client_key, other_ca,
               o_server_cert, o_server_key, o_client_cert, o_client_key, node_cert, node_key,
               expired_cert, expired_key, elsewhere_cert, elsewhere_key)
