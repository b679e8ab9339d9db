"""Throw-away certificates (a CA, a server certificate for 127.0.0.1, a client certificate) made with
`cryptography`, and a real uvicorn server with TLS (the options vLLM passes through: --ssl-certfile,
--ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs), for the TLS tests of the engine clients."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.servers import serve

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """PEM files of one certificate and its key (`both` holds the two together)."""

    cert: Path
    key: Path
    both: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    paths = Issued(directory / f"{stem}.crt", directory / f"{stem}.key", directory / f"{stem}.pem")
    paths.cert.write_bytes(cert_pem)
    paths.key.write_bytes(key_pem)
    paths.both.write_bytes(cert_pem + key_pem)
    return paths


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str) -> None:
        self._dir = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.files = _write(directory, name, self._cert, self._key)

    def issue(self, stem: str, server: bool) -> Issued:
        """A certificate for 127.0.0.1 / localhost (`server`) or a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(self._cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(self._dir, stem, builder.sign(self._key, hashes.SHA256()), key)


@contextmanager
def serve_tls(app: Any, server_cert: Issued, client_ca: Path | None = None) -> Iterator[str]:
    """Serve `app` over https on a free loopback port until the block ends; yields its base URL. With
    `client_ca`, the server requires a client certificate signed by it (mutual TLS)."""
    with serve(app, log_level="critical", lifespan="off", ssl_certfile=str(server_cert.cert),
               ssl_keyfile=str(server_cert.key), ssl_ca_certs=str(client_ca) if client_ca else None,
               ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca else ssl.CERT_NONE) as url:
        yield url
