"""A CA and a serving certificate for the webhook, for clusters without cert-manager.

``devicehost webhook-cert`` writes ``ca.crt``, ``tls.crt`` and ``tls.key``: the serving
certificate names the Service's DNS names (and any extra names or IP addresses), signed by a
new CA whose key is thrown away. ``ca.crt`` base64-encoded is the webhook configuration's
``caBundle``. Needs the ``cryptography`` package (``pip install 'devicehost[webhook-cert]'``).
"""

from __future__ import annotations

import base64
import datetime
import importlib.util
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


class CertError(Exception):
    """The certificate cannot be made or written."""


@dataclass(frozen=True)
class Written:
    ca: Path
    cert: Path
    key: Path
    ca_bundle: str
    """``ca.crt`` base64-encoded, for ``clientConfig.caBundle``."""
    not_after: datetime.datetime


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may use for ``service`` in ``namespace``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def write_certificates(
    out_dir: Path, names: Sequence[str], addresses: Sequence[str] = (), days: int = 365
) -> Written:
    """Make a CA and a serving certificate for ``names`` and ``addresses``; write them to ``out_dir``.

    :raises CertError: cryptography missing, a bad IP address, or files that cannot be written.
    """
    if importlib.util.find_spec("cryptography") is None:
        raise CertError(
            "making certificates needs the cryptography package: pip install 'devicehost[webhook-cert]'"
        )
    if not names and not addresses:
        raise CertError("name at least one DNS name or IP address for the serving certificate")
    try:
        ips = [ipaddress.ip_address(a) for a in addresses]
    except ValueError as exc:
        raise CertError(str(exc)) from None
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_pem, cert_pem, key_pem = _make(now, start, end, names, ips)
    written = Written(
        ca=out_dir / CA_FILE,
        cert=out_dir / CERT_FILE,
        key=out_dir / KEY_FILE,
        ca_bundle=base64.b64encode(ca_pem).decode(),
        not_after=end,
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write(written.ca, ca_pem, 0o644)
        _write(written.cert, cert_pem + ca_pem, 0o644)
        _write(written.key, key_pem, 0o600)
    except OSError as exc:
        raise CertError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    return written


def _make(
    now: datetime.datetime,
    start: datetime.datetime,
    end: datetime.datetime,
    names: Sequence[str],
    ips: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address],
) -> tuple[bytes, bytes, bytes]:
    """The CA's certificate, the serving certificate and its key, in PEM; the CA's key is dropped."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"devicehost webhook CA {now:%Y-%m-%d}")])
    ca = (
        _valid(x509.CertificateBuilder(), start, end)
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_usage(), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    first = names[0] if names else str(ips[0])
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt_names += [x509.IPAddress(ip) for ip in ips]
    cert = (
        _valid(x509.CertificateBuilder(), start, end)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def _valid(
    builder: x509.CertificateBuilder, start: datetime.datetime, end: datetime.datetime
) -> x509.CertificateBuilder:
    """``builder`` with a random serial number, valid from ``start`` to ``end``."""
    from cryptography import x509

    return builder.serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)


def _ca_usage() -> x509.KeyUsage:
    """Key usage of the CA: signing certificates and CRLs, nothing else."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically (a running webhook reloading it never reads half a file)."""
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)
    os.chmod(partial, mode)
    os.replace(partial, path)
