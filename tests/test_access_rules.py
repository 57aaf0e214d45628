"""Deny by default: every route of the management app (the API and the web UI) has a rule in
oz0.access.RULES, and each role's rights, in and out of its tenants, are the issue's table.
No server runs here: the app is built and walked, the rules are checked as data."""

from __future__ import annotations

import pytest

from fixtures.app_routes import registered_endpoints
from oz0 import access
from oz0.access import Right, Role


def test_every_route_has_a_rule_and_every_rule_a_route() -> None:
    endpoints = registered_endpoints()
    unruled = sorted(f"{e} {p}" for e, (p, _) in endpoints.items() if access.rule_of(e) is None)
    assert not unruled, f"routes with no rule (refused by default): {unruled}"
    stale = sorted(set(access.RULES) - set(endpoints))
    assert not stale, f"rules for routes that do not exist: {stale}"


def test_only_probes_public_files_sign_in_and_enrollment_need_no_identity() -> None:
    public = {e for e, r in access.RULES.items() if r.right is Right.PUBLIC}
    assert public <= {
        "healthz", "readyz", "metrics", "agent_download", "agent_sha256", "static",
        "web.static", "web.home", "web.ca_certificate", "web.sign_in", "operator_enroll",
    }  # fmt: skip
    # Every change needs more than reading.
    for endpoint, rule in access.RULES.items():
        if endpoint in {"web.sign_in", "operator_enroll"}:
            continue
        assert rule.doing, endpoint


# Changes a person makes about itself, or that need no identity.
OWN_CHANGES = {"operator_renew", "web.sign_out", "web.change_password", "web.sign_in"}


def test_a_route_that_changes_something_needs_more_than_reading() -> None:
    for endpoint, (path, methods) in registered_endpoints().items():
        if methods - {"GET"} and endpoint not in OWN_CHANGES and endpoint != "operator_enroll":
            right = access.RULES[endpoint].right
            assert right not in (Right.PUBLIC, Right.SELF, Right.READ), f"{endpoint} {path}"


# The table, for the routes it names by what they do.
NAMED: dict[Right, set[str]] = {
    Right.READ_OUTPUT: {"job_output"},
    Right.OPERATE: {
        "job_run", "job_cancel", "node_accept", "node_reject", "node_block", "node_unblock",
        "nodes_block", "nodes_unblock", "token_create", "token_revoke",
        "web.run_job", "web.job_cancel", "web.node_accept", "web.node_reject",
        "web.node_block", "web.node_unblock", "web.create_token", "web.revoke_token",
    },
    Right.ADMINISTER: {"node_delete", "node_purge", "web.node_delete", "web.node_purge"},
    Right.CREATE_TENANTS: {"tenant_create", "web.tenant_create"},
}  # fmt: skip


@pytest.mark.parametrize("right", list(NAMED))
def test_the_routes_the_table_names_need_its_right(right: Right) -> None:
    wrong = sorted(e for e in NAMED[right] if access.RULES[e].right is not right)
    assert not wrong, wrong


# The table: what each role may do.
MAY: dict[Right, set[Role]] = {
    Right.SELF: {Role.VIEWER, Role.OPERATOR, Role.ADMIN},
    Right.READ: {Role.VIEWER, Role.OPERATOR, Role.ADMIN},
    Right.READ_OUTPUT: {Role.OPERATOR, Role.ADMIN},
    Right.OPERATE: {Role.OPERATOR, Role.ADMIN},
    Right.ADMINISTER: {Role.ADMIN},
    Right.MANAGE_OPERATORS: {Role.ADMIN},
    Right.CREATE_TENANTS: {Role.ADMIN},
}


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("scoped", [False, True])
def test_each_role_may_what_the_table_says_in_its_tenants_and_nothing_outside(
    role: Role, scoped: bool
) -> None:
    who = access.person("operator", "alice", role, ["acme"] if scoped else [])
    for rule in access.RULES.values():
        if rule.right is Right.PUBLIC:
            continue
        allowed = role in MAY[rule.right]
        if rule.right is Right.CREATE_TENANTS and scoped:
            allowed = False  # cluster-wide admins only
        if allowed:
            who.check(rule.right, rule.doing)
            who.check(rule.right, rule.doing, tenant="acme")
        else:
            with pytest.raises(access.Forbidden, match=f"^operator alice \\({role}"):
                who.check(rule.right, rule.doing)
        if allowed and scoped and rule.right is not Right.SELF:
            with pytest.raises(access.Forbidden, match=r"in tenant default$"):
                who.check(rule.right, rule.doing, tenant="default")


def test_a_refusal_is_one_line_naming_the_person_its_role_and_the_action() -> None:
    viewer = access.person("operator", "alice", "viewer", [])
    with pytest.raises(access.Forbidden) as refused:
        viewer.check(Right.OPERATE, access.RULES["job_run"].doing)
    assert str(refused.value) == "operator alice (viewer) may not run jobs"
    scoped = access.person("operator", "bob", "operator", ["acme", "beta"])
    with pytest.raises(access.Forbidden) as refused:
        scoped.check(Right.OPERATE, "run jobs", tenant="default")
    assert str(refused.value) == (
        "operator bob (operator of acme, beta) may not run jobs in tenant default"
    )


def test_a_scoped_person_reaches_only_its_tenants() -> None:
    scoped = access.person("ui", "bob", "admin", ["acme"])
    assert scoped.scope == ("acme",) and not scoped.cluster_wide
    assert scoped.reaches("acme") and not scoped.reaches("default")
    assert scoped.reaches_all(["acme"]) and not scoped.reaches_all(["acme", "default"])
    assert not scoped.reaches_all([]), "the whole cluster is more than its tenants"
    everyone = access.person("operator", "root", "admin", [])
    assert everyone.scope is None and everyone.reaches_all([]) and everyone.reaches("x")
