"""A person's power ends when they leave, and shrinks when they are demoted or re-scoped.

What a person made goes on acting in their name after them unless something stops it: their
schedules start jobs, their join tokens let nodes in, the enrollments they made turn into
new people. In the transaction that removes or changes the person (`remove`, `change`):

- their schedules that they may no longer run (all, when removed) are paused with the reason
  until an admin takes them over (oz0/jobs/schedule_owners.py); the server then pauses
  their Temporal Schedules too, and each run checks its owner again as it starts;
- their live join tokens that they could no longer create (all, when removed: of a tenant
  they lost, or never expiring or unlimited once they are no longer an admin) are revoked;
- the enrollments they made that they could no longer make (all, unless they are still an
  admin of every tenant the enrollment gives) are cancelled: the code is refused, saying why.

Their certificate, web sessions and live streams end with the person's row already
(operators.remove; every server hears of it through `oz0_operators`). Nothing here is kept
by a server: every check reads the database, so the end holds on every server as the
transaction commits.

Audited one row per thing ended (`schedule.pause`, `token.revoke`,
`operator.enrollment.cancel`), by the admin who removed or changed the person, each with its
own tenant, the reason and what caused it: an auditor following one token or schedule finds
why it stopped in its own history, and a tenant's admin sees the rows of its tenants only.
The person's own `operator.remove` or `operator.set` row counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from oz0 import access, enrollment, operators, tokens
from oz0.jobs import schedule_owners
from oz0.jobs.schedule_owners import Held


@dataclass(frozen=True)
class Revoked:
    token_id: str
    tenant: str


@dataclass
class Ended:
    """What a removal or a change ended of what the person made."""

    paused: list[Held] = field(default_factory=list)
    revoked: list[Revoked] = field(default_factory=list)
    cancelled: list[enrollment.Open] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """What the person's own audit row says of it."""
        return {
            "schedules_paused": len(self.paused),
            "tokens_revoked": len(self.revoked),
            "enrollments_cancelled": len(self.cancelled),
        }

    def to_json(self, viewer: access.Person) -> dict[str, Any]:
        """As `operator remove` and `operator set` give it to VIEWER: the IDs and names it
        may see; those of tenants it does not reach (made before the person's tenants
        shrank) only counted."""
        paused = [h.schedule_id for h in self.paused if viewer.reaches(h.tenant)]
        revoked = [r.token_id for r in self.revoked if viewer.reaches(r.tenant)]
        cancelled = [e.name for e in self.cancelled if viewer.reaches_all(e.tenants)]
        shown = len(paused) + len(revoked) + len(cancelled)
        return {
            "schedules_paused": paused,
            "tokens_revoked": revoked,
            "enrollments_cancelled": cancelled,
            "ended_elsewhere": sum(self.counts().values()) - shown,
        }


def remove(
    conn: psycopg.Connection[Any], actor: access.Person, name: str
) -> tuple[dict[str, Any], Ended]:
    """Remove person NAME (operators.remove) and end all it made."""
    ended = Ended()

    def end(conn: psycopg.Connection[Any], now: access.Person | None) -> dict[str, int]:
        _end(conn, actor, name, now, ended, "operator.remove")
        return ended.counts()

    return operators.remove(conn, actor, name, ends=end), ended


def change(
    conn: psycopg.Connection[Any],
    actor: access.Person,
    name: str,
    *,
    role: access.Role | None,
    tenants: list[str] | None,
) -> tuple[operators.OperatorInfo, Ended]:
    """Change person NAME's role or tenants (operators.set_operator) and end what it made
    that it may no longer keep."""
    ended = Ended()

    def end(conn: psycopg.Connection[Any], now: access.Person | None) -> dict[str, int]:
        _end(conn, actor, name, now, ended, "operator.set")
        return ended.counts()

    info = operators.set_operator(conn, actor, name, role=role, tenants=tenants, ends=end)
    return info, ended


def _end(
    conn: psycopg.Connection[Any],
    actor: access.Person,
    name: str,
    now: access.Person | None,
    ended: Ended,
    action: str,
) -> None:
    """End what person NAME made that NOW (None: removed) may not keep, into ENDED."""
    because = {"because": action, "person": name}
    makers = schedule_owners.makers(name)
    role, scope = (None, ()) if now is None else (str(now.role), tuple(sorted(now.tenants)))

    held = schedule_owners.of_person(conn, name, role, scope)
    ended.paused = schedule_owners.hold(conn, held, actor.actor, because)

    for token_id, tenant, lasting in _live_tokens(conn, makers):
        if now is None:
            why = f"its creator {name} was removed"
        elif not now.has(access.Right.OPERATE) or not now.reaches(tenant):
            why = f"its creator {name} may no longer create join tokens in tenant {tenant}"
        elif lasting and now.role is not access.Role.ADMIN:
            why = (
                f"its creator {name} may no longer create tokens that never expire or have"
                " unlimited uses"
            )
        else:
            continue
        tokens.revoke(conn, token_id, actor.actor, because={"reason": why, **because})
        ended.revoked.append(Revoked(token_id, tenant))

    made = enrollment.open_made_by(conn, makers)
    gone = [e for e in made if now is None or not _may_add(now, e)]
    if now is None:
        reason = f"{name}, who made it, was removed"
    else:
        reason = f"{name}, who made it, may no longer add such a person"
    enrollment.cancel(conn, gone, actor, reason, because)
    ended.cancelled = gone


def _may_add(person: access.Person, made: enrollment.Open) -> bool:
    """Whether PERSON may still add the person MADE is for (enrollment.add's rule)."""
    return person.has(access.Right.MANAGE_OPERATORS) and (
        person.cluster_wide or (bool(made.tenants) and person.reaches_all(made.tenants))
    )


def _live_tokens(conn: psycopg.Connection[Any], makers: list[str]) -> list[tuple[str, str, bool]]:
    """The tokens MAKERS made that still let nodes in: ID, tenant, and whether it never
    expires or takes any number of nodes. Locked until the transaction ends."""
    rows = conn.execute(
        "SELECT id, tenant, expires_at IS NULL OR max_uses = 0 FROM join_tokens"
        " WHERE created_by = ANY(%s) AND revoked_at IS NULL"
        " AND (expires_at IS NULL OR expires_at > now()) AND (max_uses = 0 OR uses < max_uses)"
        " ORDER BY id FOR UPDATE",
        (makers,),
    ).fetchall()
    return [(str(i), str(t), bool(lasting)) for i, t, lasting in rows]
