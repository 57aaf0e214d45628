from __future__ import annotations

import ssl

import trio
import trio.testing
from cryptography import x509

from fixtures.memory_cluster import in_memory_cluster
from fixtures.tls import served_certificate
from oz0 import pki
from oz0.server.certificates import RENEW_EVERY, ServerCertificates
from oz0_common.certs import API_SERVER_NAME


async def test_certificates_are_renewed_daily_in_the_live_tls_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = in_memory_cluster()
    certs = ServerCertificates(cluster, "server-1", sans=("127.0.0.11", "edge.example.com"))
    ctx = certs.server_context(ssl.CERT_OPTIONAL, tickets=0)
    first = await served_certificate(ctx, cluster.ca_pem)
    identity = pki.identity_of(first)
    assert (identity.role, identity.name) == ("server", "server-1")
    sans = first.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # The last: the name our clients send on 8443 (oz0/server/tls.py).
    assert sans.get_values_for_type(x509.DNSName) == ["edge.example.com", API_SERVER_NAME]
    internode = pki.cert_from_pem(certs.internode_cert_pem)
    internode.verify_directly_issued_by(cluster.internode_ca.cert)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(certs.renew_forever)
        began = trio.current_time()
        await trio.sleep(RENEW_EVERY - 1)
        assert (await served_certificate(ctx, cluster.ca_pem)).serial_number == first.serial_number
        await trio.sleep(2)
        renewed = await served_certificate(ctx, cluster.ca_pem)
        assert renewed.serial_number != first.serial_number
        assert trio.current_time() - began == RENEW_EVERY + 1
        nursery.cancel_scope.cancel()
    assert renewed.public_key() != first.public_key()


async def test_a_renewal_hook_is_called_while_its_holder_runs_and_never_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    certs = ServerCertificates(in_memory_cluster(), "server-1", sans=("127.0.0.11",))
    told: list[float] = []

    async def hook() -> None:
        told.append(trio.current_time())

    async def holder(*, task_status: trio.TaskStatus[None]) -> None:
        with certs.told_of_renewals(hook):
            task_status.started()
            await trio.sleep(RENEW_EVERY + 1)  # one renewal, then it ends

    async with trio.open_nursery() as nursery:
        began = trio.current_time()
        await nursery.start(holder)
        nursery.start_soon(certs.renew_forever)
        await trio.sleep(3 * RENEW_EVERY + 1)
        nursery.cancel_scope.cancel()
    assert told == [began + RENEW_EVERY]
