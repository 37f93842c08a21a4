"""The webhook's own CA and serving certificate (``host/webhook/cert.py``), read back with
cryptography as a TLS client would check them."""

from __future__ import annotations

import base64
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from devicehost.host.webhook.cert import CertError, service_names, write_certificates


def test_the_serving_certificate_names_the_service_and_is_signed_by_the_ca(tmp_path: Path) -> None:
    names = service_names("devicehost-webhook", "kube-system")
    assert names[-1] == "devicehost-webhook.kube-system.svc.cluster.local"
    written = write_certificates(tmp_path / "tls", names, ["10.0.0.7"], days=30)
    ca = x509.load_pem_x509_certificate(written.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(written.cert.read_bytes())
    assert base64.b64decode(written.ca_bundle) == written.ca.read_bytes()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == names
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    assert cert.issuer == ca.subject
    assert cert.not_valid_after_utc == written.not_after.replace(microsecond=0)  # X.509 keeps seconds
    assert 29 <= (written.not_after - cert.not_valid_before_utc).days <= 30
    public = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(public, rsa.RSAPublicKey):
        public.verify(
            cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm
        )
    else:
        assert isinstance(public, ec.EllipticCurvePublicKey)
        public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert stat.S_IMODE(written.key.stat().st_mode) & 0o077 == 0  # the key is the owner's alone


@pytest.mark.parametrize(
    ("names", "addresses", "problem"),
    [
        ((), (), "name at least one DNS name or IP address"),
        (("svc",), ("not-an-ip",), "not-an-ip"),
    ],
)
def test_a_certificate_that_cannot_be_made_is_one_error(
    tmp_path: Path, names: tuple[str, ...], addresses: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(CertError, match=problem):
        write_certificates(tmp_path, names, addresses)
    assert list(tmp_path.iterdir()) == []
