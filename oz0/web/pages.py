"""What every page module of the web UI shares: the signed-in session, guarded form posts,
rendering with the layout's facts, and the notice shown after an action (each page module
names its own; routes.py composes them).

A page module is `add(web, pages)`: it registers its routes on the blueprint `web` and
uses `pages` (a Pages) for everything below, so no module has its own copy of the checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

import trio
from quart import Response, g, redirect, render_template, request
from werkzeug.datastructures import MultiDict
from werkzeug.wrappers.response import Response as WerkzeugResponse

from oz0 import access
from oz0 import ui_sessions as sessions
from oz0.server.api.common import ManagementState

Page = Response | WerkzeugResponse | str | tuple[str, int]

# What a page open in a tab asks by itself (live updates, a running job's polls): not
# activity, so they do not start a session's idle clock again.
PASSIVE = frozenset({"web.events", "web.job_live"})
# Password checks (scrypt: tens of milliseconds of CPU and 16 MiB each) at a time: a crowd
# of sign-ins queues here, holding no database connection, and leaves the CPUs to the rest.
HASHING_THREADS = 2


class NotSignedIn(Exception):
    """Raised by `Pages.session()`; answered with a redirect to the sign-in page."""


class Refused(Exception):
    """A post without this session's CSRF token, or from another site: answered 403."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def compose_notices(*tables: Mapping[str, str]) -> Mapping[str, str]:
    """What `?done=KEY` may show after an action redirected back, from each page module's
    TABLES: a fixed text per key, so a link cannot make a page say what it likes. A key
    two modules give is a mistake, found as the web UI is built."""
    notices: dict[str, str] = {}
    for table in tables:
        twice = notices.keys() & table.keys()
        if twice:
            raise ValueError(f"notices given by two page modules: {sorted(twice)}")
        notices.update(table)
    return MappingProxyType(notices)


@dataclass(frozen=True)
class Pages:
    state: ManagementState
    # compose_notices' table.
    notices: Mapping[str, str]
    hashing: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(HASHING_THREADS)
    )

    # When this server's sign-ins last deleted failures too old to count.
    pruning: sessions.FailurePruning = field(default_factory=sessions.FailurePruning)

    @cached_property
    def names(self) -> sessions.Names:
        """What sign-in failures of names with no account are counted under."""
        return sessions.Names.of(self.state.cluster.name, self.state.cluster.master_key)

    @staticmethod
    def source() -> str:
        client = request.scope.get("client")
        return str(client[0]) if client else "unknown"

    @staticmethod
    def same_origin() -> bool:
        fetch_site = request.headers.get("Sec-Fetch-Site")
        if fetch_site is not None:
            return fetch_site == "same-origin"
        origin = request.headers.get("Origin")
        return origin is not None and origin == f"https://{request.host}"

    async def session_of(self, token: str | None, touch: bool = True) -> sessions.Session | None:
        return await self.state.db.transaction(
            lambda conn: sessions.current(conn, token, touch=touch)
        )

    async def session_or_none(self) -> sessions.Session | None:
        touch = request.endpoint not in PASSIVE
        return await self.session_of(request.cookies.get(sessions.COOKIE), touch)

    async def session(self) -> sessions.Session:
        """The signed-in session; NotSignedIn (→ the sign-in page) if there is none. Read
        once per request (the blueprint's rule check reads it before the page)."""
        found: sessions.Session | None = g.get("session")
        if found is not None:
            return found
        current = await self.session_or_none()
        if current is None:
            raise NotSignedIn()
        g.session = current
        return current

    async def posted(self) -> tuple[sessions.Session, MultiDict[str, str]]:
        """The session and form of a state-changing POST, once its CSRF token and origin
        are checked; Refused otherwise (and NotSignedIn without a session)."""
        if not self.same_origin():
            raise Refused("a request from another site")
        current = await self.session()
        form = await request.form
        if not current.csrf_matches(form.get("csrf")):
            raise Refused("a request without this session's token")
        return current, form

    async def render(
        self, template: str, session: sessions.Session | None, status: int = 200, **facts: Any
    ) -> tuple[str, int]:
        notice = self.notices.get(request.args.get("done", ""))
        person = session.person if session is not None else None
        page = await render_template(
            template,
            cluster=self.state.cluster,
            server_id=self.state.server_id,
            session=session,
            person=person,
            may=lambda right: may(person, right),
            may_use=lambda endpoint: may_use(person, endpoint),
            notice=notice,
            section=request.path.strip("/").split("/")[0],
            **facts,
        )
        return page, status

    async def missing(self, session: sessions.Session, what: str) -> tuple[str, int]:
        """The 404 page: WHAT (e.g. "node n-1a2b") is not known to the cluster."""
        return await self.render("missing.html", session, 404, what=what)

    def done(self, location: str, notice: str) -> WerkzeugResponse:
        """Back to LOCATION after an action (303: the browser GETs it), saying NOTICE."""
        assert notice in self.notices, notice
        joiner = "&" if "?" in location else "?"
        return redirect(f"{location}{joiner}done={notice}", 303)

    @staticmethod
    def query(**changes: str | int | None) -> str:
        """This page's URL with CHANGES to its query (None drops a parameter): for filters
        and paging links, which keep the other filters."""
        args: dict[str, str] = {k: v for k, v in request.args.items() if k != "done"}
        for key, value in changes.items():
            if value is None or value == "":
                args.pop(key, None)
            else:
                args[key] = str(value)
        return f"{request.path}?{urlencode(args)}" if args else request.path


def may(person: access.Person | None, right: str) -> bool:
    """For templates: whether PERSON's role gives the right named RIGHT ("OPERATE"), so a
    page shows no button, link or form for what the server would refuse."""
    return person is not None and person.has(access.Right[right])


def may_use(person: access.Person | None, endpoint: str) -> bool:
    """For templates: whether PERSON may use the page or action ENDPOINT ("web.node_block"),
    by the same rule the server checks (a page the rule table does not name: no)."""
    rule = access.rule_of(endpoint)
    return person is not None and rule is not None and person.has(rule.right)


def text_arg(args: Mapping[str, str], name: str, limit: int = 200) -> str | None:
    """A filter from the query string: None when absent or blank, cut to LIMIT characters."""
    value = args.get(name, "").strip()
    return value[:limit] or None
