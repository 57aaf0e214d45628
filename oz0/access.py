"""Who may do what: roles, the rights they give, a person's tenant scope, and the one table
that names the right every API route and web action needs (deny by default).

A person is an operator: a certificate for the CLI and API, and, if it has one, the web
UI account of the same name. Its role says what it may do; its tenants where (none listed:
every tenant, a cluster-wide person). Outside its tenants a person sees nothing: another
tenant's node, job or token is answered as not found, and listings leave them out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from oz0 import audit
from oz0.errors import Oz0Error


class Role(enum.StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


class Right(enum.Enum):
    PUBLIC = "public"  # no identity at all: probes, the CA, the sign-in page, enrollment
    SELF = "self"  # any person, about itself: renew its certificate, its password, sign out
    READ = "read"  # nodes, tokens (never secrets), jobs and attempts, tenants, servers, audit
    READ_OUTPUT = "read job output"
    OPERATE = "operate"  # run and cancel jobs; accept, reject, block, unblock; tokens
    ADMINISTER = "administer"  # delete and purge nodes
    MANAGE_OPERATORS = "manage operators"  # list, add, change and remove operators
    # Cluster-wide admins only: create and change tenants, change the cluster's settings.
    CREATE_TENANTS = "create tenants"


ROLE_RIGHTS: dict[Role, frozenset[Right]] = {
    Role.VIEWER: frozenset({Right.SELF, Right.READ}),
    Role.OPERATOR: frozenset({Right.SELF, Right.READ, Right.READ_OUTPUT, Right.OPERATE}),
    Role.ADMIN: frozenset(
        {
            Right.SELF,
            Right.READ,
            Right.READ_OUTPUT,
            Right.OPERATE,
            Right.ADMINISTER,
            Right.MANAGE_OPERATORS,
            Right.CREATE_TENANTS,
        }
    ),
}


class Forbidden(Oz0Error):
    """A person may not do this (HTTP 403); the message is the one line the CLI prints."""


@dataclass(frozen=True)
class Person(audit.Actor):
    """An operator as the API or the web UI sees it (`kind` "operator" or "ui"): an audit
    actor, so every change it makes is recorded in its name."""

    role: Role = Role.VIEWER
    # The tenants it may reach; empty: every tenant.
    tenants: frozenset[str] = frozenset()

    @property
    def cluster_wide(self) -> bool:
        return not self.tenants

    @property
    def scope(self) -> tuple[str, ...] | None:
        """The tenants a listing may show, sorted; None: every tenant."""
        return None if self.cluster_wide else tuple(sorted(self.tenants))

    @property
    def actor(self) -> audit.Actor:
        return audit.Actor(self.kind, self.name)

    def has(self, right: Right) -> bool:
        """Whether the role gives RIGHT somewhere (in the person's tenants)."""
        if right is Right.PUBLIC:
            return True
        if right is Right.CREATE_TENANTS and not self.cluster_wide:
            return False
        return right in ROLE_RIGHTS[self.role]

    def reaches(self, tenant: str) -> bool:
        """Whether TENANT is one of the person's (any, for a cluster-wide person)."""
        return self.cluster_wide or tenant in self.tenants

    def reaches_all(self, tenants: Iterable[str]) -> bool:
        """Whether every tenant of TENANTS (empty: the whole cluster) is the person's."""
        wanted = set(tenants)
        return self.cluster_wide or (bool(wanted) and wanted <= self.tenants)

    def check(self, right: Right, doing: str, tenant: str | None = None) -> None:
        """Forbidden unless the role gives RIGHT (and, with TENANT, the tenant is the
        person's). DOING completes "may not ...": "run jobs", "delete nodes"."""
        if not self.has(right):
            raise Forbidden(f"{self.describe()} may not {doing}")
        if tenant is not None and not self.reaches(tenant):
            raise Forbidden(f"{self.describe()} may not {doing} in tenant {tenant}")

    def describe(self) -> str:
        """`operator alice (viewer)`, `operator bob (operator of acme, beta)`."""
        where = "" if self.cluster_wide else " of " + ", ".join(sorted(self.tenants))
        return f"operator {self.name} ({self.role}{where})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": str(self.role), "tenants": sorted(self.tenants)}


def person(kind: Literal["operator", "ui"], name: str, role: str, tenants: Sequence[str]) -> Person:
    return Person(kind, name, Role(role), frozenset(tenants))


@dataclass(frozen=True)
class Rule:
    """The right a route needs, and what it does in words for a refusal ("run jobs")."""

    right: Right
    doing: str


def _rule(right: Right, doing: str = "") -> Rule:
    return Rule(right, doing or right.value)


# Every route of the management app, by its endpoint name (web pages under `web.`). The
# app refuses a route this table does not name (tests/test_access_rules.py walks them all).
# A route's right is checked before its handler runs; a handler that touches one tenant's
# object checks the tenant too (another tenant's object is "not found").
RULES: dict[str, Rule] = {
    # Probes and public files.
    "healthz": _rule(Right.PUBLIC),
    "readyz": _rule(Right.PUBLIC),
    "metrics": _rule(Right.PUBLIC),
    "agent_download": _rule(Right.PUBLIC),
    "agent_sha256": _rule(Right.PUBLIC),
    "static": _rule(Right.PUBLIC),
    # The API (operator certificates).
    "cluster_info": _rule(Right.READ, "read the cluster"),
    # The API described (api/openapi.py): any signed-in person, as every listing.
    "openapi_document": _rule(Right.READ, "read the API's description"),
    "cluster_set": _rule(Right.CREATE_TENANTS, "change the cluster's settings"),
    "operator_renew": _rule(Right.SELF, "renew its certificate"),
    # A new person has no identity yet: its one-time code is its proof (oz0/enrollment.py).
    "operator_enroll": _rule(Right.PUBLIC),
    "operator_list": _rule(Right.MANAGE_OPERATORS, "list operators"),
    "operator_show": _rule(Right.MANAGE_OPERATORS, "see operators"),
    "operator_add": _rule(Right.MANAGE_OPERATORS, "add operators"),
    "operator_set": _rule(Right.MANAGE_OPERATORS, "change operators"),
    "operator_remove": _rule(Right.MANAGE_OPERATORS, "remove operators"),
    "tenant_list": _rule(Right.READ, "list tenants"),
    "tenant_create": _rule(Right.CREATE_TENANTS, "create tenants"),
    "tenant_show": _rule(Right.READ, "read tenants"),
    "tenant_set": _rule(Right.CREATE_TENANTS, "change tenants"),
    "token_list": _rule(Right.READ, "list join tokens"),
    "token_create": _rule(Right.OPERATE, "create join tokens"),
    "token_revoke": _rule(Right.OPERATE, "revoke join tokens"),
    "node_list": _rule(Right.READ, "list nodes"),
    "node_show": _rule(Right.READ, "read nodes"),
    "node_accept": _rule(Right.OPERATE, "accept nodes"),
    "node_reject": _rule(Right.OPERATE, "reject nodes"),
    "nodes_block": _rule(Right.OPERATE, "block nodes"),
    "nodes_unblock": _rule(Right.OPERATE, "unblock nodes"),
    "node_block": _rule(Right.OPERATE, "block nodes"),
    "node_unblock": _rule(Right.OPERATE, "unblock nodes"),
    "node_purge": _rule(Right.ADMINISTER, "purge nodes"),
    "node_delete": _rule(Right.ADMINISTER, "delete nodes"),
    # A shell on a node is operating it: operators and admins of its tenant (api/sessions.py).
    "node_session": _rule(Right.OPERATE, "open sessions on nodes"),
    # That a session happened: its tenant's readers; what it showed: its admins only.
    "session_list": _rule(Right.READ, "list sessions"),
    "session_show": _rule(Right.READ, "read sessions"),
    "session_recording": _rule(Right.ADMINISTER, "read sessions' recordings"),
    "audit_list": _rule(Right.READ, "read the audit log"),
    # Its rows as they commit (api/events.py), each person's as the list shows them.
    "events_stream": _rule(Right.READ, "follow the audit log"),
    "job_run": _rule(Right.OPERATE, "run jobs"),
    "job_list": _rule(Right.READ, "list jobs"),
    "job_show": _rule(Right.READ, "read jobs"),
    "job_output": _rule(Right.READ_OUTPUT, "read job output"),
    "job_cancel": _rule(Right.OPERATE, "cancel jobs"),
    # Files pushed to nodes (issue 43): who may run jobs in a tenant may push its files.
    "file_add": _rule(Right.OPERATE, "push files"),
    "file_chunk": _rule(Right.OPERATE, "push files"),
    "file_list": _rule(Right.READ, "list files"),
    "file_show": _rule(Right.READ, "read files"),
    "file_delete": _rule(Right.OPERATE, "delete files"),
    # Schedules: who may run jobs in a tenant may make and change its schedules.
    "schedule_create": _rule(Right.OPERATE, "create schedules"),
    "schedule_list": _rule(Right.READ, "list schedules"),
    "schedule_show": _rule(Right.READ, "read schedules"),
    "schedule_pause": _rule(Right.OPERATE, "pause schedules"),
    "schedule_unpause": _rule(Right.OPERATE, "unpause schedules"),
    "schedule_trigger": _rule(Right.OPERATE, "trigger schedules"),
    "schedule_delete": _rule(Right.OPERATE, "delete schedules"),
    # Giving a schedule to another person (its owner left): an admin's, as people are.
    "schedule_set": _rule(Right.MANAGE_OPERATORS, "change schedules' owners"),
    # The web UI (a session of the person's web account).
    "web.static": _rule(Right.PUBLIC),
    "web.home": _rule(Right.PUBLIC),
    "web.ca_certificate": _rule(Right.PUBLIC),
    "web.sign_in": _rule(Right.PUBLIC),
    "web.sign_out": _rule(Right.SELF, "sign out"),
    "web.account": _rule(Right.SELF, "see its account"),
    "web.change_password": _rule(Right.SELF, "change its password"),
    "web.overview": _rule(Right.READ, "see the overview"),
    "web.events": _rule(Right.READ, "follow live updates"),
    "web.tenant_list": _rule(Right.READ, "list tenants"),
    "web.tenant_create": _rule(Right.CREATE_TENANTS, "create tenants"),
    "web.server_list": _rule(Right.READ, "list servers"),
    "web.audit_log": _rule(Right.READ, "read the audit log"),
    "web.jobs_page": _rule(Right.READ, "list jobs"),
    "web.new_job": _rule(Right.OPERATE, "run jobs"),
    "web.run_job": _rule(Right.OPERATE, "run jobs"),
    "web.job_show": _rule(Right.READ, "read jobs"),
    "web.job_live": _rule(Right.READ, "read jobs"),
    "web.job_cancel": _rule(Right.OPERATE, "cancel jobs"),
    "web.schedules_page": _rule(Right.READ, "list schedules"),
    "web.create_schedule": _rule(Right.OPERATE, "create schedules"),
    "web.schedule_pause": _rule(Right.OPERATE, "pause schedules"),
    "web.schedule_unpause": _rule(Right.OPERATE, "unpause schedules"),
    "web.schedule_trigger": _rule(Right.OPERATE, "trigger schedules"),
    "web.schedule_delete_confirm": _rule(Right.OPERATE, "delete schedules"),
    "web.schedule_delete": _rule(Right.OPERATE, "delete schedules"),
    "web.node_list": _rule(Right.READ, "list nodes"),
    "web.node_show": _rule(Right.READ, "read nodes"),
    "web.node_accept": _rule(Right.OPERATE, "accept nodes"),
    "web.node_reject": _rule(Right.OPERATE, "reject nodes"),
    "web.node_block": _rule(Right.OPERATE, "block nodes"),
    "web.node_unblock": _rule(Right.OPERATE, "unblock nodes"),
    "web.node_delete_confirm": _rule(Right.ADMINISTER, "delete nodes"),
    "web.node_delete": _rule(Right.ADMINISTER, "delete nodes"),
    "web.node_purge_confirm": _rule(Right.ADMINISTER, "purge nodes"),
    "web.node_purge": _rule(Right.ADMINISTER, "purge nodes"),
    "web.tokens_page": _rule(Right.READ, "list join tokens"),
    "web.new_token": _rule(Right.OPERATE, "create join tokens"),
    "web.create_token": _rule(Right.OPERATE, "create join tokens"),
    "web.confirm_revoke": _rule(Right.OPERATE, "revoke join tokens"),
    "web.revoke_token": _rule(Right.OPERATE, "revoke join tokens"),
    # What a session showed only to admins (the page says so to the others).
    "web.sessions_page": _rule(Right.READ, "list sessions"),
    "web.session_show": _rule(Right.READ, "read sessions"),
    "web.session_frames": _rule(Right.ADMINISTER, "read sessions' recordings"),
}


# A session as a named account of the node (`node shell --user`), not a UID of its own:
# that account's files and processes are the session's, so its tenant's admins only (and
# only where the node lists the account: oz0-node --session-users).
NAMED_USER_SESSIONS = _rule(Right.ADMINISTER, "open sessions as a named user")


def rule_of(endpoint: str | None) -> Rule | None:
    """The rule of ENDPOINT; None when the table names none (the route is refused)."""
    return RULES.get(endpoint or "")
