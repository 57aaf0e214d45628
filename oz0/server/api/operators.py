"""POST /api/v1/operator/renew (a person's own certificate); GET and POST
/api/v1/operator/enroll (no identity: what a new person pins, then its code traded for its
certificate); GET and POST /api/v1/operators, GET, PATCH and DELETE
/api/v1/operators/<name> (an admin's: the people of the cluster, or of its tenants)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Required, TypedDict, TypeVar

import psycopg
import trio
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import access, enrollment, leaving, operators, passwords, pki, ui_accounts
from oz0.errors import Oz0Error
from oz0.server.api import schedules
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described

T = TypeVar("T")
_REFUSED = {404: "no such person (or not one of one's tenants)", 409: "a conflict"}


class Csr(TypedDict):
    # A PEM certificate signing request of the person's new key.
    csr: str


class Renewed(TypedDict):
    certificate: str
    not_after: str


class Pinned(TypedDict):
    """What `operator enroll` pins (by its hash) before it sends its code."""

    cluster: str
    ca_certificate: str


class Enrolment(TypedDict, total=False):
    code: Required[str]
    csr: Required[str]
    # Absent: no web sign-in.
    web_password: str | None


class Enrolled(TypedDict):
    name: str
    role: str
    tenants: list[str]
    cluster: str
    certificate: str
    not_after: str
    web_sign_in: bool


class Operators(TypedDict):
    operators: list[operators.OperatorJson]


class NewPerson(TypedDict, total=False):
    name: Required[str]
    role: Required[Literal["viewer", "operator", "admin"]]
    tenants: list[str]
    # How long its one-time code lasts: 24h, 7d.
    expires: str


class Added(TypedDict):
    name: str
    role: str
    tenants: list[str]
    expires_at: str
    enroll_command: str
    # The one-time code, shown this once.
    code: str


class PersonChange(TypedDict, total=False):
    role: Literal["viewer", "operator", "admin"] | None
    tenants: list[str] | None


class Ended(TypedDict):
    """What a removal or a change ended of what the person made."""

    schedules_paused: list[str]
    tokens_revoked: list[str]
    enrollments_cancelled: list[str]
    # Those in tenants one does not reach: only counted.
    ended_elsewhere: int
    schedules_not_paused_in_temporal: list[str]


class Changed(operators.OperatorJson, Ended):
    pass


class Removed(Ended):
    name: str
    role: str
    tenants: list[str]
    was: str
    web_account: bool
    sessions_ended: int


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.post("/api/v1/operator/renew")
    @described("Renew one's own certificate", body=Csr, answers={200: Renewed})
    async def operator_renew() -> Response:
        actor = await operator(state)
        body = await json_object()
        if not isinstance(body.get("csr"), str):
            raise ApiError(400, "body must be a JSON object with a PEM `csr`")
        try:
            public_key = pki.csr_public_key(body["csr"].encode())
        except ValueError as e:
            raise ApiError(400, f"bad certificate request: {e}") from None
        try:
            cert = await state.db.transaction(
                lambda conn: operators.issue_certificate(
                    conn,
                    state.cluster.cluster_ca,
                    actor.name,
                    public_key,
                    actor=actor,
                    action="operator.renew",
                    create=False,
                )
            )
        except operators.OperatorNotFound as e:
            raise ApiError(403, str(e)) from None
        # Refused here at once, not only once the notification comes back.
        state.operator_cache.forget(actor.name)
        return jsonify(
            {
                "certificate": pki.cert_to_pem(cert).decode(),
                "not_after": cert.not_valid_after_utc.isoformat(),
            }
        )

    # One endpoint for both methods: the rule table names it once, as public.
    @app.route("/api/v1/operator/enroll", methods=["GET", "POST"])
    @described("The cluster's CA, to pin before enrolling", answers={200: Pinned}, method="GET")
    @described(
        "Trade a one-time code for one's certificate (no identity needed)", body=Enrolment,
        answers={200: Enrolled}, method="POST",
    )  # fmt: skip
    async def operator_enroll() -> Response:
        if request.method == "GET":
            # What `operator enroll` pins (by its hash) before it sends its code.
            return jsonify(
                {"cluster": state.cluster.name, "ca_certificate": state.cluster.ca_pem.decode()}
            )
        return await _enroll(state)

    @app.get("/api/v1/operators")
    @described("People of the cluster (or of one's tenants)", answers={200: Operators})
    async def operator_list() -> Response:
        person = await operator(state)
        rows = await state.db.transaction(lambda conn: operators.list_operators(conn, person))
        return jsonify({"operators": [r.to_json() for r in rows]})

    @app.post("/api/v1/operators")
    @described(
        "Add a person: a one-time code to enroll with", body=NewPerson, answers={200: Added},
        errors=_REFUSED,
    )  # fmt: skip
    async def operator_add() -> Response:
        person = await operator(state)
        body = await json_object()
        name, role, tenants = body.get("name"), body.get("role"), body.get("tenants", [])
        expires = body.get("expires", enrollment.DEFAULT_EXPIRES)
        if not isinstance(name, str) or not isinstance(expires, str):
            raise ApiError(400, "body must be a JSON object with a `name` and a `role`")
        server = await state.db.transaction(_own_address(state.server_id))

        def add(conn: psycopg.Connection[Any]) -> enrollment.Added:
            return enrollment.add(
                conn, person, name, _role(role), _tenants(tenants),
                enrollment.parse_expires(expires),
                server=server or request.host, ca_hash=state.cluster.ca_hash,
            )  # fmt: skip

        added = await _answer(state.db.transaction(add))
        return jsonify({**added.to_json(), "code": added.code})

    @app.get("/api/v1/operators/<name>")
    @described("A person", answers={200: operators.OperatorJson}, errors=_REFUSED)
    async def operator_show(name: str) -> Response:
        person = await operator(state)
        info = await _answer(state.db.transaction(lambda c: operators.show(c, person, name)))
        return jsonify(info.to_json())

    @app.patch("/api/v1/operators/<name>")
    @described(
        "Change a person's role or tenants", body=PersonChange, answers={200: Changed},
        errors=_REFUSED,
    )  # fmt: skip
    async def operator_set(name: str) -> Response:
        person = await operator(state)
        body = await json_object()
        role = None if body.get("role") is None else _role(body["role"])
        tenants = None if body.get("tenants") is None else _tenants(body["tenants"])
        info, ended = await _answer(
            state.db.transaction(
                lambda conn: leaving.change(conn, person, name, role=role, tenants=tenants)
            )
        )
        state.operator_cache.forget(name)
        return jsonify({**info.to_json(), **await _ended(state, person, ended)})

    @app.delete("/api/v1/operators/<name>")
    @described("Remove a person", answers={200: Removed}, errors=_REFUSED)
    async def operator_remove(name: str) -> Response:
        person = await operator(state)
        removed, ended = await _answer(
            state.db.transaction(lambda conn: leaving.remove(conn, person, name))
        )
        # This server at once; the others when the `oz0_operators` notification comes.
        state.operator_cache.forget(name)
        return jsonify({**removed, **await _ended(state, person, ended)})


async def _ended(
    state: ManagementState, person: access.Person, ended: leaving.Ended
) -> dict[str, Any]:
    """What a removal or a change ended, as PERSON may see it, once the schedules it paused
    are paused in Temporal as well (their runs started nothing from the commit on)."""
    shown = ended.to_json(person)
    not_paused = await schedules.pause_held(state, ended.paused)
    late = [i for i in not_paused if i in shown["schedules_paused"]]
    return {**shown, "schedules_not_paused_in_temporal": late}


def _own_address(server_id: str) -> Callable[[psycopg.Connection[Any]], str | None]:
    """Where this server says it is reached (what the enroll command names): it is up."""

    def read(conn: psycopg.Connection[Any]) -> str | None:
        row = conn.execute("SELECT advertise FROM servers WHERE id = %s", (server_id,)).fetchone()
        return str(row[0]) if row else None

    return read


def _role(value: Any) -> access.Role:
    try:
        return access.Role(value)
    except ValueError:
        raise ApiError(400, "`role` must be one of viewer, operator, admin") from None


def _tenants(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ApiError(400, "`tenants` must be a list of tenant names")
    return list(value)


async def _answer(work: Awaitable[T]) -> T:
    """WORK's result; a refusal becomes the API's answer (403, 404, 409, 400)."""
    try:
        result = await work
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None
    except operators.OperatorError as e:
        raise ApiError(e.status, str(e)) from None
    except Oz0Error as e:
        raise ApiError(400, str(e)) from None
    return result


async def _enroll(state: ManagementState) -> Response:
    body = await json_object()
    code, csr, password = body.get("code"), body.get("csr"), body.get("web_password")
    if not isinstance(code, str) or not isinstance(csr, str):
        raise ApiError(400, "body must be a JSON object with a `code` and a PEM `csr`")
    if password is not None and not isinstance(password, str):
        raise ApiError(400, "`web_password` must be a string, or absent for no web sign-in")
    try:
        public_key = pki.csr_public_key(csr.encode())
    except ValueError as e:
        raise ApiError(400, f"bad certificate request: {e}") from None
    if password is not None:
        try:
            ui_accounts.check_new(password, password)
        except ui_accounts.PasswordRefused as e:
            raise ApiError(400, str(e)) from None
    source = enrollment.source_of(request.scope.get("client"))
    refused = await state.db.transaction(lambda conn: enrollment.check_code(conn, code, source))
    if refused is not None:
        raise ApiError(refused.status, str(refused))
    # scrypt takes its 50 ms in a thread, outside any transaction (the pool is shared).
    password_hash = None
    if password is not None:
        password_hash = await trio.to_thread.run_sync(passwords.hash_password, password)
    done = await _answer(
        state.db.transaction(
            lambda conn: enrollment.enroll(
                conn, state.cluster.cluster_ca, code, public_key, password_hash, source
            )
        )
    )
    if isinstance(done, enrollment.CodeRefused):
        raise ApiError(done.status, str(done))
    return jsonify(done.to_json(state.cluster.name))
