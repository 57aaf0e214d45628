"""The browser's trust (issue 28, item 9): the web UI on 8443 shows browsers a certificate
from the cluster's web UI CA, whose critical name constraints hold it to the cluster's own
names, or the organisation's own (`--ui-cert/--ui-key`); the CLI, naming `API_SERVER_NAME`,
keeps the cluster-CA certificate it pins. A real server on 127.0.0.160; .161 is a rogue
TLS server holding a certificate the UI CA issued for a name outside its constraints.
Chromium trusts the UI CA the honest way: in the NSS database of its home directory
(`certutil`), as an operator's browser would after importing it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from playwright import sync_api as playwright

from fixtures.cluster import ClusterFiles, StartServer
from fixtures.rogue_edge import load_cluster
from fixtures.tls import assert_refused_at_tls, served_certificate
from fixtures.web_events import curl
from oz0 import cluster, pki
from oz0.server.certificates import RENEW_EVERY, ServerCertificates
from oz0_common.certs import API_SERVER_NAME
from tests.conftest import CliRunner
from tests.web_support import CHROMIUM

ADVERTISE = "127.0.0.160"
ROGUE = "127.0.0.161"
UI_NAME = "ui.uicert.example"


def browser_handshake(address: str, ca_pem: bytes, server_name: str | None = None) -> bytes:
    """The certificate a client trusting only CA_PEM verifies on ADDRESS:8443, checking the
    host name as a browser does (SERVER_NAME, else the IP address, for which no server name
    is sent: RFC 6066)."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection((address, 8443), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name or address) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def served_ui_ca(address: str) -> bytes:
    answer = curl("-o", "-", "-w", "", f"https://{address}:8443/ca.pem")
    assert answer.returncode == 0 and "BEGIN CERTIFICATE" in answer.stdout, answer.stderr
    return answer.stdout.encode()


def s_client(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["openssl", "s_client", "-verify_return_error", *args],
        input="", capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip


def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.slow
def test_a_browser_gets_the_ui_chain_whose_ca_is_constrained_to_the_cluster_names(
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    start_server(cluster_files, ADVERTISE, "--san", UI_NAME)
    ui_ca_pem = served_ui_ca(ADVERTISE)
    ui_ca = x509.load_pem_x509_certificate(ui_ca_pem)
    constraints = ui_ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    assert set(constraints.value.permitted_subtrees or ()) == {
        x509.DNSName(UI_NAME),
        x509.IPAddress(ipaddress.ip_network(f"{ADVERTISE}/32")),
    }
    assert constraints.value.excluded_subtrees is None
    assert ui_ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # The UI CA is the cluster's own (sealed in its row), not the cluster CA.
    held = load_cluster(cluster_files)
    assert held.ui_ca is not None and held.ui_ca.cert == ui_ca
    assert ui_ca != held.cluster_ca.cert

    # A browser by IP address (no server name) and by the name both verify it, host
    # names checked; the page tells the UI CA's fingerprint.
    leaf = x509.load_der_x509_certificate(browser_handshake(ADVERTISE, ui_ca_pem))
    assert leaf.issuer == ui_ca.subject
    assert browser_handshake(ADVERTISE, ui_ca_pem, UI_NAME) == leaf.public_bytes(
        serialization.Encoding.DER
    )
    assert held.ui_ca_fingerprint in curl(f"https://{ADVERTISE}:8443/").stdout
    ca_file = write(tmp_path / "ui-ca.pem", ui_ca_pem)
    browser = s_client("-connect", f"{ADVERTISE}:8443", "-noservername", "-CAfile",
                       str(ca_file), "-verify_ip", ADVERTISE)  # fmt: skip
    assert "Verify return code: 0 (ok)" in browser.stdout, browser.stdout + browser.stderr
    # The cluster CA does not verify what a browser gets: browsers need not trust it.
    with pytest.raises(ssl.SSLCertVerificationError):
        browser_handshake(ADVERTISE, held.ca_pem)

    # Our own clients' name gets the cluster-CA certificate: the one the CLI pins.
    context_ca = cluster_files.context_dir / "ca.crt"
    ours = s_client("-connect", f"{ADVERTISE}:8443", "-servername", API_SERVER_NAME,
                    "-CAfile", str(context_ca), "-verify_hostname", API_SERVER_NAME)  # fmt: skip
    assert "Verify return code: 0 (ok)" in ours.stdout, ours.stdout + ours.stderr
    assert "OU = server" in ours.stdout and "ui-ca" not in ours.stdout
    info = cli("cluster", "info", "--json", env=cluster_env)
    assert info.code == 0, info.err
    # The docs' way to fetch the UI CA over the connection the context's CA verifies.
    pinned = curl("--cacert", str(context_ca), "--connect-to",
                  f"{API_SERVER_NAME}:8443:{ADVERTISE}:8443", "-o", "-",
                  f"https://{API_SERVER_NAME}:8443/ca.pem")  # fmt: skip
    assert pinned.returncode == 0 and pinned.stdout.encode() == ui_ca_pem, pinned.stderr


def test_the_ui_ca_is_good_for_no_other_name_and_signs_no_operator_the_api_takes(
    cluster_files: ClusterFiles, start_server: StartServer, tmp_path: Path
) -> None:
    start_server(cluster_files, ADVERTISE)
    held = load_cluster(cluster_files)
    assert held.ui_ca is not None
    ca_file = write(tmp_path / "ui-ca.pem", held.ui_ca_pem)
    key = pki.new_private_key()

    def verify(*names: str) -> subprocess.CompletedProcess[str]:
        cert = held.ui_ca.issue(  # type: ignore[union-attr]
            key.public_key(), name="rogue", role=pki.Role.SERVER,
            validity=dt.timedelta(days=1), sans=names, server=True, client=False,
        )  # fmt: skip
        leaf = write(tmp_path / "leaf.pem", pki.cert_to_pem(cert))
        return subprocess.run(["openssl", "verify", "-CAfile", str(ca_file), str(leaf)],
                              capture_output=True, text=True, check=False)  # fmt: skip

    assert verify(ADVERTISE).returncode == 0
    # With no DNS name in the cluster, DNS names are still constrained (RFC 5280 leaves a
    # kind of name no subtree mentions free), and so is every other address.
    for names in (("evil.example",), ("10.9.8.7",), (ADVERTISE, "evil.example"), ("::1",)):
        refused = verify(*names)
        assert refused.returncode != 0, names
        assert "permitted subtree violation" in refused.stdout + refused.stderr, names

    # Nor is its key good for anything but web UI certificates: an operator certificate it
    # signs is refused by the API, which trusts the cluster CA alone.
    forged = held.ui_ca.issue(
        key.public_key(), name="admin", role=pki.Role.OPERATOR,
        validity=dt.timedelta(days=1), client=True,
    )  # fmt: skip
    cert_file = write(tmp_path / "forged.crt", pki.cert_to_pem(forged))
    key_file = write(tmp_path / "forged.key", pki.key_to_pem(key), 0o600)
    ctx = ssl.create_default_context(cafile=str(cluster_files.context_dir / "ca.crt"))
    ctx.check_hostname = False
    ctx.load_cert_chain(str(cert_file), str(key_file))
    assert_refused_at_tls(ADVERTISE, 8443, ctx, "/api/v1/cluster", API_SERVER_NAME)
    ctx = ssl.create_default_context(cadata=held.ui_ca_pem.decode())
    ctx.load_cert_chain(str(cert_file), str(key_file))
    assert_refused_at_tls(ADVERTISE, 8443, ctx, "/api/v1/cluster", ADVERTISE)


@pytest.mark.slow
def test_a_server_the_ui_ca_is_not_good_for_warns_and_its_ui_certificate_leaves_that_name_out(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    start_server(cluster_files, ADVERTISE)
    # The UI CA was made by the first server: the second's address is not among its names.
    second = start_server(cluster_files, ROGUE, "--san", UI_NAME)
    ui_ca_pem = served_ui_ca(ROGUE)
    assert served_ui_ca(ADVERTISE) == ui_ca_pem
    log = second.own_log()
    assert f"the web UI CA of cluster test is not good for {ROGUE}, {UI_NAME}" in log, log
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        browser_handshake(ROGUE, ui_ca_pem)
    leaf = x509.load_der_x509_certificate(browser_handshake(ADVERTISE, ui_ca_pem))
    assert leaf.issuer == x509.load_pem_x509_certificate(ui_ca_pem).subject


@contextmanager
def rogue_server(certs: dict[str, tuple[bytes, bytes]]) -> Iterator[None]:
    """A TLS server on ROGUE:8443 answering 200 with the certificate and key CERTS names
    for the server name a client sends."""
    contexts: dict[str, ssl.SSLContext] = {}
    for name, (cert_pem, key_pem) in certs.items():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"rogue-{os.getpid()}-{name}.pem"
        write(cert_file, cert_pem + key_pem, 0o600)
        try:
            ctx.load_cert_chain(str(cert_file))
        finally:
            cert_file.unlink()
        contexts[name] = ctx
    first = next(iter(contexts.values()))

    def choose(tls: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        if name in contexts:
            tls.context = contexts[name]

    first.sni_callback = choose
    listener = socket.create_server((ROGUE, 8443))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                raw.settimeout(5)
                with first.wrap_socket(raw, server_side=True) as tls:
                    tls.recv(4096)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                                b"Content-Length: 40\r\nConnection: close\r\n\r\n"
                                b"<html><title>rogue</title>rogue!</html>\n")  # fmt: skip
            except (OSError, ssl.SSLError):
                raw.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def nss_home(root: Path, ca_pem: bytes) -> Path:
    """A home directory whose NSS database (what Chromium on Linux trusts besides its own
    roots) trusts CA_PEM, and only it, as a CA for web sites."""
    db = root / ".pki" / "nssdb"
    db.mkdir(parents=True)
    ca_file = write(root / "ui-ca.pem", ca_pem)
    for args in (("-N", "--empty-password"), ("-A", "-n", "oz0 web UI", "-t", "C,,", "-i",
                                              str(ca_file))):  # fmt: skip
        subprocess.run(["certutil", "-d", f"sql:{db}", *args], check=True, capture_output=True)
    return root


@pytest.mark.slow
def test_chromium_trusting_only_the_ui_ca_opens_the_sign_in_page_and_refuses_other_names(
    cluster_files: ClusterFiles, start_server: StartServer, tmp_path: Path
) -> None:
    start_server(cluster_files, ADVERTISE, "--san", UI_NAME)
    held = load_cluster(cluster_files)
    assert held.ui_ca is not None
    key = pki.new_private_key()

    def leaf(name: str) -> tuple[bytes, bytes]:
        cert = held.ui_ca.issue(  # type: ignore[union-attr]
            key.public_key(), name="rogue", role=pki.Role.SERVER,
            validity=dt.timedelta(days=1), sans=(name,), server=True, client=False,
        )  # fmt: skip
        return pki.cert_to_pem(cert), pki.key_to_pem(key)

    home = nss_home(tmp_path / "home", served_ui_ca(ADVERTISE))
    rules = f"MAP {UI_NAME} {ROGUE}, MAP evil.example {ROGUE}"
    with (
        rogue_server({UI_NAME: leaf(UI_NAME), "evil.example": leaf("evil.example")}),
        playwright.sync_playwright() as p,
    ):
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            env={**os.environ, "HOME": str(home)},
            args=[f"--host-resolver-rules={rules}"],
        )
        try:
            page = browser.new_context().new_page()  # certificate errors are errors
            page.goto(f"https://{ADVERTISE}:8443/")
            assert page.title().startswith("Sign in"), page.title()
            assert held.ui_ca_fingerprint in page.content()
            # A certificate of the UI CA for a name it permits is trusted (so the refusal
            # below is the name constraints', not an untrusted CA's)...
            page.goto(f"https://{UI_NAME}:8443/")
            assert page.title() == "rogue"
            # ...and one for any other name is refused, though the same CA signed it.
            with pytest.raises(playwright.Error, match=r"net::ERR_CERT_"):
                page.goto("https://evil.example:8443/")
        finally:
            browser.close()


def organisation_pair(tmp_path: Path, *names: str) -> tuple[Path, Path, bytes]:
    """An organisation's CA (RSA, as many are) and a certificate of it for NAMES: the chain
    file, the key file (0600) and the CA to trust."""
    now = pki.utcnow()
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Example Org CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(pki.subject_alt_names(names)), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    chain = write(tmp_path / "ui.crt", leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
    return chain, write(tmp_path / "ui.key", key_pem, 0o600), ca_pem


@pytest.mark.slow
def test_the_organisations_certificate_is_served_to_browsers_and_the_cli_keeps_working(
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    chain, key, org_ca = organisation_pair(tmp_path, "ui.org.example", ADVERTISE)
    server = start_server(cluster_files, ADVERTISE, "--ui-cert", str(chain), "--ui-key", str(key))
    assert f"organisation's certificate for ui.org.example, {ADVERTISE}, valid until" in (
        server.own_log()
    )
    served = x509.load_der_x509_certificate(browser_handshake(ADVERTISE, org_ca))
    assert served == x509.load_pem_x509_certificate(chain.read_bytes())
    assert browser_handshake(ADVERTISE, org_ca, "ui.org.example") == served.public_bytes(
        serialization.Encoding.DER
    )
    info = cli("cluster", "info", "--json", env=cluster_env)
    assert info.code == 0, info.err
    assert cli("node", "list", "--json", env=cluster_env).code == 0


def test_a_bad_ui_certificate_or_key_stops_the_start_with_one_line(
    cluster_files: ClusterFiles, cli: CliRunner, tmp_path: Path
) -> None:
    chain, key, _ = organisation_pair(tmp_path, "ui.org.example")
    (tmp_path / "other").mkdir()
    _, other_key, _ = organisation_pair(tmp_path / "other", "other.example")
    start = ("server", "start", "--master-key-file", str(cluster_files.master_key),
             "--advertise", ADVERTISE)  # fmt: skip
    env = cluster_files.cli_env

    def refused(*args: str) -> str:
        result = cli(*start, *args, env=env)
        assert result.code == 1, result
        assert result.err.count("\n") == 1, result.err
        return result.err

    assert "--ui-cert and --ui-key go together" in refused("--ui-cert", str(chain))
    assert "is not the key of the certificate" in refused(
        "--ui-cert", str(chain), "--ui-key", str(other_key)
    )
    key.chmod(0o644)
    assert "open to group or others" in refused("--ui-cert", str(chain), "--ui-key", str(key))
    key.chmod(0o600)
    assert "holds no PEM certificate" in refused("--ui-cert", str(key), "--ui-key", str(key))
    assert "not found" in refused("--ui-cert", str(chain), "--ui-key", str(tmp_path / "none"))


async def test_the_management_context_serves_the_ui_certificate_by_default_renewed_daily(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = (ADVERTISE, UI_NAME)
    held = cluster.Cluster(
        name="c", history_shards=4, cluster_ca=pki.new_ca("c", "cluster"),
        internode_ca=pki.new_ca("c", "internode"), ui_ca=pki.new_ui_ca("c", names),
    )  # fmt: skip
    assert held.ui_ca is not None
    certs = ServerCertificates(held, "server-1", sans=(*names, "elsewhere.example"))
    ctx = certs.management_context(tickets=1)
    ui = await served_certificate(ctx, held.ui_ca_pem, None)
    ui.verify_directly_issued_by(held.ui_ca.cert)
    # Only the names the UI CA permits: a browser refuses a certificate naming any other.
    sans = ui.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [UI_NAME]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [ADVERTISE]
    assert await served_certificate(ctx, held.ui_ca_pem, "elsewhere.example") == ui
    api = await served_certificate(ctx, held.ca_pem, API_SERVER_NAME)
    api.verify_directly_issued_by(held.cluster_ca.cert)
    assert pki.identity_of(api).role == "server"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(certs.renew_forever)
        await trio.sleep(RENEW_EVERY + 1)
        renewed = await served_certificate(ctx, held.ui_ca_pem, None)
        assert renewed.serial_number != ui.serial_number
        renewed.verify_directly_issued_by(held.ui_ca.cert)
        assert (await served_certificate(ctx, held.ca_pem, API_SERVER_NAME)).serial_number != (
            api.serial_number
        )
        nursery.cancel_scope.cancel()
