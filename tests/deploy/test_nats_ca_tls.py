"""NOETL_NATS_CA: the CA of NATS servers whose certificates a private CA signed, for the NATS connection only.

The chart used to set ``SSL_CERT_FILE`` to that CA for the whole process: Python's default TLS context
then trusted it alone, and every ``http`` task of a worker to a public HTTPS endpoint failed. A real
``nats-server`` with TLS (a certificate of a CA made here) checks that the connection trusts the CA named
by ``NOETL_NATS_CA`` while the process's default context is left as it was.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from noetl_stream.errors import ConfigurationError
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA, and a certificate it signs for 127.0.0.1: (ca.crt, server.crt, server.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("noetl test CA"))
        .issuer_name(_name("noetl test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("nats"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem(key))
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedNats, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_ca_and_server_cert(directory)
    conf = directory / "tls.conf"
    conf.write_text(f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n  timeout: 2\n}}\n')
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"), config_file=conf)
    try:
        server.start()
        yield server, ca
    finally:
        server.close()


async def test_the_nats_connection_trusts_the_ca_of_noetl_nats_ca(
    tls_server: tuple[EmbeddedNats, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca = tls_server
    url = f"tls://127.0.0.1:{server.port}"
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("NOETL_NATS_CA", raising=False)
    # Without it, the server's certificate is not trusted (the system's CAs did not sign it).
    with pytest.raises(ConnectionError, match="cannot connect to NATS"):
        await connect(url, name="pytest-tls", connect_wait_s=2, max_reconnect_attempts=1)

    monkeypatch.setenv("NOETL_NATS_CA", str(ca))
    nc = await connect(url, name="pytest-tls", connect_wait_s=10)
    try:
        reply = await nc.request("$JS.API.INFO", b"", timeout=5)  # a round trip over TLS
        assert b"memory" in reply.data
        assert nc.connected_url is not None and nc.connected_url.scheme == "tls"
    finally:
        await nc.close()


async def test_an_unreadable_ca_file_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit code 2 at the edge (one line naming the variable), not a TLS failure retried forever."""
    monkeypatch.setenv("NOETL_NATS_CA", str(tmp_path / "missing.crt"))
    with pytest.raises(ConfigurationError, match=r"NOETL_NATS_CA=.*missing\.crt: cannot read it"):
        await connect("tls://127.0.0.1:1", connect_wait_s=1)
    (tmp_path / "not-pem.crt").write_text("not a certificate\n")
    monkeypatch.setenv("NOETL_NATS_CA", str(tmp_path / "not-pem.crt"))
    with pytest.raises(ConfigurationError, match="no PEM CA certificate"):
        await connect("tls://127.0.0.1:1", connect_wait_s=1)
    monkeypatch.delenv("NOETL_NATS_CA")
    monkeypatch.setenv("NOETL_NATS_CREDS", str(tmp_path / "missing.creds"))
    with pytest.raises(ConfigurationError, match=r"NOETL_NATS_CREDS=.*missing\.creds: cannot read it"):
        await connect("nats://127.0.0.1:1", connect_wait_s=1)
