"""Security properties of the real CLI: TLS with a private CA, no secrets in
output, private state files, no root needed."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA
from tests.reliability.nobody import (
    open_to_everyone,
    run_as_nobody,
    skip_unless_root_with_setpriv,
    stage_tree,
    world_readable_dir,
)
from tests.reliability.proxy import FaultProxy

pytestmark = pytest.mark.integration

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
PASSWORD = "Zq9-very-distinctive-Pa55"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(subject, issuer, key, signer, *, ca: bool):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


def _pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca_and_server_cert(where: Path) -> tuple[Path, Path, Path]:
    """(CA cert, server cert, server key), all PEM files in ``where``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("node-agent test CA", "node-agent test CA", ca_key, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = _cert("127.0.0.1", "node-agent test CA", key, ca_key, ca=False)
    paths = where / "ca.pem", where / "server.pem", where / "server.key"
    paths[0].write_bytes(_pem(ca))
    paths[1].write_bytes(_pem(server))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture
def tls_placement(placement_server, tmp_path):
    """The real Placement behind a TLS proxy signed by a private CA."""
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    proxy = FaultProxy(placement_server.url, tls=context).start()
    yield proxy.url, ca
    proxy.stop()


def placement_section(url: str, *lines: str) -> str:
    return (
        "[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {url}\n" + "".join(f"{line}\n" for line in lines)
    )


def test_tls_with_the_private_ca_works(tls_placement, tmp_path, host_name):
    url, ca = tls_placement
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(url, f"cafile = {ca}")
    )
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 0, result.stderr
    assert "insecure" not in result.stderr


def test_tls_with_the_wrong_ca_fails_with_one_clear_line(tls_placement, tmp_path, host_name):
    url, _ca = tls_placement
    other = tmp_path / "other"
    other.mkdir()
    wrong_ca, _, _ = make_ca_and_server_cert(other)
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(url, f"cafile = {wrong_ca}")
    )
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 75, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "node-agent: error" in line]
    assert len(errors) == 1 and "certificate verify failed" in errors[0], result.stderr
    assert not (tmp_path / "state").exists()


def test_insecure_mode_works_and_warns_once(tls_placement, tmp_path, host_name):
    url, _ca = tls_placement
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(url, "insecure = true")
    )
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 0, result.stderr
    warnings = [
        line
        for line in result.stderr.splitlines()
        if "WARNING" in line and "insecure = true" in line
    ]
    assert len(warnings) == 1, result.stderr
    assert "NOT verified" in warnings[0]


@pytest.mark.parametrize(
    "args",
    [
        ("--once", "--debug"),
        ("--once", "--dry-run", "--debug"),
        ("--once", "--dry-run", "--output", "json"),
        ("--check-config",),
    ],
)
def test_the_keystone_password_never_appears_in_output(tmp_path, args):
    # A keystone that does not exist: the client must fail without echoing it.
    config = write_config(
        tmp_path,
        TEST6,
        extra=(
            "[placement]\nauth_type = password\nauth_url = http://127.0.0.1:9/identity\n"
            f"username = node-agent\npassword = {PASSWORD}\nproject_name = service\n"
            "user_domain_name = Default\nproject_domain_name = Default\n"
            "[DEFAULT]\n"
            f"transport_url = rabbit://node-agent:{PASSWORD}@127.0.0.1:9/\n"
        ),
    )
    result = run_agent("--config-file", str(config), *args)
    assert result.code in (0, 75), (result.code, result.stderr)
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_state_file_is_private_to_the_service_user(placement_server, tmp_path, host_name):
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(placement_server.url)
    )
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 0, result.stderr
    files = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert files
    for path in files:
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600, path
        assert info.st_uid == os.geteuid(), path


def test_the_agent_needs_no_root(tmp_path):
    skip_unless_root_with_setpriv()
    base = world_readable_dir()
    try:
        config = write_config(base, stage_tree(TEST6, base))
        open_to_everyone(base)
        result = run_as_nobody(
            "--config-file", str(config), "--once", "--dry-run", "--output", "json"
        )
        assert result.code == 0, result.stderr
        assert result.json()["providers"][0]["inventories"]["VCPU"]["total"] == 6
        assert not (base / "state").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_provider_config_directory_the_user_cannot_search_is_a_config_error():
    # As installed, /etc/node-agent is 0750 root:node-agent: anyone else
    # running the CLI cannot tell whether provider_config/ exists.
    skip_unless_root_with_setpriv()
    base = world_readable_dir()
    try:
        config = write_config(base, stage_tree(TEST6, base))
        private = base / "private"
        config.write_text(
            config.read_text().replace(
                str(base / "provider_config"), str(private / "provider_config")
            )
        )
        for path in base.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        private.mkdir(mode=0o700)
        result = run_as_nobody("--config-file", str(config), "--once", "--dry-run")
        assert result.code == 78, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert "provider_config_location" in result.stderr, result.stderr
        assert result.stdout == ""
    finally:
        shutil.rmtree(base, ignore_errors=True)
