"""Whose name a schedule's runs start jobs in, and the pause that waits for an admin.

A schedule's runs start jobs in its owner's name: its creator (`created_by`), or the person
an admin gave it to (`schedule set ID --owner NAME`, `take_over`). When the owner leaves or
may no longer run it (oz0/leaving.py), the schedule is paused with the reason
(`paused_reason`: "its creator alice was removed") until an admin takes it over; its
Temporal Schedule is paused with the same words. Each run checks again as it starts
(`check_run`, in the transaction that would make its job): a schedule whose owner no longer
exists, or may no longer run it, starts nothing and is paused so, whoever changed the person
and however (a server of the previous release, an edit of the table by hand).

The owner's row is read FOR SHARE there: a removal or a change of the person waits for a run
making its job, and a run that comes after sees the change, so no job starts in a person's
name once the transaction that removed or demoted them has committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oz0 import access, audit
from oz0.errors import Oz0Error
from oz0.jobs import store

# The actor kinds of a person: its certificate ("operator") and its web account ("ui").
PERSON_KINDS = ("operator", "ui")


class OwnerRefused(Oz0Error):
    """The schedule cannot be given to that person (HTTP 400): the message says why."""


def makers(name: str) -> list[str]:
    """How the rows person NAME made name their maker (`created_by`, `owner`)."""
    return [f"{kind}:{name}" for kind in PERSON_KINDS]


def person_name(maker: str) -> str | None:
    """The person a `created_by` or `owner` value names; None if not a person's."""
    kind, _, name = maker.partition(":")
    return name if kind in PERSON_KINDS and name else None


@dataclass(frozen=True)
class Held:
    """A schedule paused until an admin takes it over, and why."""

    schedule_id: str
    tenant: str
    reason: str

    @property
    def note(self) -> str:
        """What its Temporal Schedule's pause says, and `schedule show` (its state)."""
        return f"paused: {self.reason}"


def why_not(
    name: str, role: str | None, tenants: Sequence[str], tenant: str, *, creator: bool
) -> str | None:
    """Why person NAME (of ROLE in TENANTS; ROLE None: gone) may not own a schedule of
    TENANT any more, in the words `schedule show` gives; None if it may."""
    who = f"its {'creator' if creator else 'owner'} {name}"
    if role is None:
        return f"{who} was removed"
    person = access.person("operator", name, role, tenants)
    if not person.has(access.Right.OPERATE):
        return f"{who} may no longer run jobs (now a {role})"
    if not person.reaches(tenant):
        return f"{who} may no longer run jobs in tenant {tenant}"
    return None


def _person(conn: store.Conn, name: str | None) -> tuple[str, list[str]] | None:
    """Person NAME's role and tenants, its row locked FOR SHARE until the transaction
    ends (see the module's docstring); None if there is no such person."""
    if name is None:
        return None
    row = conn.execute(
        "SELECT role, tenants FROM operators WHERE name = %s FOR SHARE", (name,)
    ).fetchone()
    return (str(row[0]), list(row[1])) if row is not None else None


def check_run(
    conn: store.Conn,
    schedule_id: str,
    tenant: str,
    owner: str,
    *,
    creator: bool,
    paused_reason: str | None,
) -> Held | None:
    """Whether a run of the schedule may start a job in OWNER's name now: None if it may;
    else why not, the schedule paused so if it was not yet (audited `schedule.pause` by the
    schedule itself)."""
    if paused_reason is not None:
        return Held(schedule_id, tenant, paused_reason)
    name = person_name(owner)
    found = _person(conn, name)
    role, tenants = found if found is not None else (None, [])
    reason = why_not(name or owner, role, tenants, tenant, creator=creator)
    if reason is None:
        return None
    held = Held(schedule_id, tenant, reason)
    hold(conn, [held], audit.Actor("schedule", schedule_id), {"found_by": "its run"})
    return held


def of_person(conn: store.Conn, name: str, role: str | None, tenants: Sequence[str]) -> list[Held]:
    """The schedules person NAME owns that it may not own as ROLE in TENANTS (ROLE None:
    removed), not paused for it yet; locked until the transaction ends."""
    rows = conn.execute(
        "SELECT id, tenant, owner IS NULL FROM schedules"
        " WHERE coalesce(owner, created_by) = ANY(%s) AND paused_reason IS NULL"
        " ORDER BY id FOR UPDATE",
        (makers(name),),
    ).fetchall()
    found = []
    for schedule_id, tenant, creator in rows:
        reason = why_not(name, role, tenants, tenant, creator=bool(creator))
        if reason is not None:
            found.append(Held(str(schedule_id), str(tenant), reason))
    return found


def hold(
    conn: store.Conn, held: Iterable[Held], actor: audit.Actor, because: dict[str, Any]
) -> list[Held]:
    """Pause HELD until an admin takes them over; each audited `schedule.pause` by ACTOR
    with its reason and BECAUSE (what made it so). Those paused so already are left."""
    wanted = {h.schedule_id: h for h in held}
    if not wanted:
        return []
    ids = sorted(wanted)
    rows = conn.execute(
        "UPDATE schedules AS s SET paused_reason = r.reason"
        " FROM unnest(%s::text[], %s::text[]) AS r(id, reason)"
        " WHERE s.id = r.id AND s.paused_reason IS NULL RETURNING s.id",
        (ids, [wanted[i].reason for i in ids]),
    ).fetchall()
    done = [wanted[str(r[0])] for r in rows]
    done.sort(key=lambda h: h.schedule_id)
    audit.record_many(
        conn, actor, "schedule.pause",
        [(f"schedule:{h.schedule_id}", {"tenant": h.tenant, "reason": h.reason, **because})
         for h in done],
        tenants=[[h.tenant] for h in done],
    )  # fmt: skip
    return done


@dataclass(frozen=True)
class TakenOver:
    """A schedule given to a new owner: whose it was, whose it is, and whether that resumed
    it (it was paused until an admin took it over)."""

    schedule_id: str
    tenant: str
    was: str
    now: str
    resumed: bool


def take_over(
    conn: store.Conn, actor: access.Person, schedule_id: str, tenant: str, name: str
) -> TakenOver:
    """Give the schedule SCHEDULE_ID (of TENANT) to person NAME, who must be allowed to run
    it, and end its pause for an owner who left; audited `schedule.owner`. Only an admin of
    the tenant may (access.Forbidden). An unknown NAME and one who may not run it get the
    same answer (OwnerRefused)."""
    actor.check(access.Right.MANAGE_OPERATORS, "change schedules' owners", tenant=tenant)
    row = conn.execute(
        "SELECT coalesce(owner, created_by), paused_reason FROM schedules WHERE id = %s FOR UPDATE",
        (schedule_id,),
    ).fetchone()
    found = _person(conn, name)
    if row is None or found is None or why_not(name, *found, tenant, creator=False):
        raise OwnerRefused(
            f"operator {name} cannot own schedule {schedule_id}: a schedule's owner must be"
            f" an enrolled operator or admin of tenant {tenant}"
        )
    was, paused_reason = str(row[0]), row[1]
    now = f"operator:{name}"
    conn.execute(
        "UPDATE schedules SET owner = %s, paused_reason = NULL WHERE id = %s", (now, schedule_id)
    )
    taken = TakenOver(schedule_id, tenant, was, now, resumed=paused_reason is not None)
    audit.record(
        conn, actor, "schedule.owner", f"schedule:{schedule_id}",
        {"tenant": tenant, "from": was, "to": now, "resumed": taken.resumed,
         **({"was_paused": paused_reason} if paused_reason is not None else {})},
        tenants=[tenant],
    )  # fmt: skip
    return taken
