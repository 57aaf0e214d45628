"""The job role's sweeper and its Temporal client's reconnect (oz0/jobs/role.py), against a
real Temporal (one server on 127.0.0.230) and a real database.

The role under test runs in this process on a database of its own (a second cluster's,
never served, so no server sweeps its jobs), with one tenant whose namespace the test
registers in the server's Temporal. Two fakes inject the fault, nothing else: a connect
that, once the role reconnects, waits until the test lets it go; and a call the role's
portal hands to its asyncio loop starting there late (as a busy loop would take it), so
that a sweep's call decided while the old client was there reaches the loop during the
reconnect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio
from temporalio.client import Client

from fixtures.jobs_role import role_cluster
from fixtures.temporal import Credentials
from oz0 import audit, pki
from oz0.jobs import store
from oz0.jobs.role import JobsRole
from oz0.jobs.spec import JobSpec
from oz0.store.events import EventHub
from oz0.store.pool import open_database
from oz0.temporal.namespaces import FrontendAccess
from oz0_common import asyncio_portal

SERVER = "127.0.0.230"
TEMPORAL = f"{SERVER}:7233"
TENANT = "reconnects"
BOUND = 60.0
# A kicked sweep makes its call at once (the database answers in milliseconds).
HANDED_WITHIN = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Credentials, str]]:
    """A running server (its Temporal), and the database of the role under test: a second
    cluster's, holding tenant TENANT, whose namespace the server's Temporal has."""
    with role_cluster(tmp_path_factory.mktemp("jobs-reconnect"), SERVER, [TENANT]) as both:
        yield both


def _new_job(conninfo: str) -> str:
    with psycopg.connect(conninfo) as conn:
        job = store.create(
            conn, JobSpec(tenant=TENANT, command=["true"]), audit.Actor("operator", "test")
        )
    return job.id


def _started(conninfo: str, job_id: str) -> bool:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT workflow_started FROM jobs WHERE id = %s", (job_id,)).fetchone()
    return bool(row and row[0])


async def _wait_started(conninfo: str, job_id: str) -> None:
    # The database says when; nothing else tells this process.
    while not await trio.to_thread.run_sync(_started, conninfo, job_id):  # noqa: ASYNC110
        await trio.sleep(0.1)


async def test_a_sweep_that_meets_a_reconnect_is_retried_and_the_role_survives(
    cluster: tuple[Credentials, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    creds, conninfo = cluster
    access = FrontendAccess(TEMPORAL, creds.ca_pem, creds.cert_pem, creds.key_pem)

    # Fault 1: a reconnect's connect waits until RELEASE.
    real_connect = Client.connect
    connects: list[str] = []
    reconnecting, release = threading.Event(), threading.Event()

    async def connect(*args: Any, **kwargs: Any) -> Client:
        if connects:  # connected once: this is the reconnect
            reconnecting.set()
            await asyncio.to_thread(release.wait, BOUND)
        client = await real_connect(*args, **kwargs)
        connects.append(args[0])
        return client

    monkeypatch.setattr(Client, "connect", connect)

    # Fault 2: while LATE is set, the next call the portal hands to its asyncio loop starts
    # there only once the reconnect is under way. Injected where every call of the portal
    # (oz0_common/asyncio_portal.py) begins on the loop; setattr fails if that is gone.
    real_call = asyncio_portal._call
    late, handed = threading.Event(), threading.Event()

    async def arrives_late(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> Any:
        if late.is_set():
            late.clear()
            handed.set()
            await asyncio.to_thread(reconnecting.wait, BOUND)
        return await real_call(fn, args)

    monkeypatch.setattr(asyncio_portal, "_call", arrives_late)

    with trio.fail_after(BOUND):
        async with open_database(conninfo) as db, trio.open_nursery() as nursery:
            role = JobsRole(
                db, EventHub(conninfo), lambda: access, "server-reconnect-test",
                ca=pki.new_ca("reconnect-test", "cluster"),  # it signs; no node checks
            )  # fmt: skip
            await nursery.start(role.run)
            first = await trio.to_thread.run_sync(_new_job, conninfo)
            role.kick()
            await _wait_started(conninfo, first)  # connected and sweeping

            late.set()
            second = await trio.to_thread.run_sync(_new_job, conninfo)
            role.kick()
            # Decided with the old client. Within a bound well inside the test's: a fault
            # that never comes (its seam moved) says so rather than timing the test out.
            assert await trio.to_thread.run_sync(handed.wait, HANDED_WITHIN), (
                "no call reached the portal's loop: the fault's seam is not on its path"
            )
            role.renewed()
            await trio.to_thread.run_sync(reconnecting.wait, BOUND)
            await trio.sleep(1.0)  # the late call meets the reconnect; sweeps go on
            assert not await trio.to_thread.run_sync(_started, conninfo, second)
            release.set()
            await _wait_started(conninfo, second)
            assert len(connects) == 2
            nursery.cancel_scope.cancel()
