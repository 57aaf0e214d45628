"""`orchestrator-zero server ...`: commands run on a server's machine.

The only command group that loads the server (trio, psycopg, temporalio, the web stack),
and only inside its commands: every other command, `--help` and `server --help` included,
starts without it (tests/test_cli_imports.py).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from cli.output import print_json
from cli.params import JsonFlag
from oz0.context import check_address, config_home
from oz0.errors import Oz0Error
from oz0.node_rules import MAX_PENDING
from oz0.server_defaults import (
    MAX_EVENT_STREAMS_PER_PERSON,
    MAX_LIVE_PAGES_PER_PERSON,
    MAX_WEB_SESSIONS_PER_PERSON,
    PERSON_REQUEST_BURST,
    PERSON_REQUESTS_PER_SECOND,
    RECONCILE_EVERY,
)

if TYPE_CHECKING:
    from oz0.server import start as server_start
    from oz0.server import tls
    from oz0.server.person_limits import PersonLimits
    from oz0.server.systemd_notify import Notifier
    from oz0.store.dburl import DatabaseUrl

app = App(name="server", help_format="markdown")  # help: cli/main.py
log = logging.getLogger(__name__)

operator_app = App(name="operator", help="Operator credentials made on a server's machine.")
app.command(operator_app)

DevFlag = Annotated[
    bool, Parameter(name="--dev", negative=(), help="Use the embedded dev cluster in --data-dir.")
]
DataDir = Annotated[Path | None, Parameter(name="--data-dir", help="Dev mode's directory.")]
VerboseFlag = Annotated[
    bool,
    Parameter(
        name="--verbose",
        negative=(),
        help="Print every log line on stderr, Temporal's and the embedded PostgreSQL's too.",
    ),
]


def _progress(message: str) -> None:
    print(message, file=sys.stderr)


@app.command
def init(
    *,
    cluster_name: str | None = None,
    history_shards: int | None = None,
    master_key_out: Path | None = None,
    upgrade: bool = False,
    advertise: str = "127.0.0.1",
    json: JsonFlag = False,
) -> int:
    """Create the cluster in the database named by $OZ0_DB (once), or upgrade its schema.

    Parameters
    ----------
    cluster_name
        The cluster's name: lowercase letters, digits and '-'.
    history_shards
        Temporal history shards; can never change later.
    master_key_out
        Where to write the new master key (mode 0600). Back it up.
    upgrade
        Apply the schema migrations of a newer release to an existing cluster.
    advertise
        Address (HOST or HOST:PORT) of a server that the operator context points at.
    """
    from oz0 import cluster_init
    from oz0.store.dburl import DatabaseUrl

    url = DatabaseUrl.from_env()
    if upgrade:
        applied = cluster_init.upgrade(url, progress=_progress)
        if json:
            print_json({"applied": applied})
        else:
            print(f"applied migrations {applied}" if applied else "schema already up to date")
        return 0
    missing = [
        flag
        for flag, value in (
            ("--cluster-name", cluster_name),
            ("--history-shards", history_shards),
            ("--master-key-out", master_key_out),
        )
        if value is None
    ]
    if missing:
        raise Oz0Error(f"server init needs {', '.join(missing)}")
    assert cluster_name and history_shards is not None and master_key_out
    check_address(advertise)
    result = cluster_init.init_cluster(
        url,
        cluster_name=cluster_name,
        history_shards=history_shards,
        master_key_out=master_key_out,
        context_dir=config_home() / cluster_name,
        advertise=advertise,
        progress=_progress,
    )
    if json:
        print_json(
            {
                "cluster": result.cluster,
                "ca_hash": result.ca_hash,
                "context": str(result.context_path),
                "master_key_file": str(master_key_out),
                "ui_account": cluster_init.FIRST_UI_ACCOUNT,
                "ui_password": result.ui_password,
            }
        )
        return 0
    print(f"cluster {result.cluster} created")
    print(f"  CA hash:          {result.ca_hash}")
    print(f"  master key:       {master_key_out}  (back it up; every server needs a copy)")
    print(f"  operator context: {result.context_path}")
    print(f"  web UI account:   {cluster_init.FIRST_UI_ACCOUNT}")
    print(f"  web UI password:  {result.ui_password}  (shown only now)")
    return 0


@app.command
def start(
    *,
    master_key_file: Path | None = None,
    advertise: str | None = None,
    san: Annotated[tuple[str, ...], Parameter(consume_multiple=False)] = (),
    listen: str | None = None,
    dev: DevFlag = False,
    data_dir: DataDir = None,
    reconcile_every: float = RECONCILE_EVERY,
    max_pending_nodes: int = MAX_PENDING,
    max_web_sessions_per_person: int = MAX_WEB_SESSIONS_PER_PERSON,
    max_live_pages_per_person: int = MAX_LIVE_PAGES_PER_PERSON,
    max_event_streams_per_person: int = MAX_EVENT_STREAMS_PER_PERSON,
    person_requests_per_second: float = PERSON_REQUESTS_PER_SECOND,
    person_request_burst: int = PERSON_REQUEST_BURST,
    ui_cert: Path | None = None,
    ui_key: Path | None = None,
    verbose: VerboseFlag = False,
) -> int:
    """Run this server's roles (management 8443, edge 7443) until SIGINT or SIGTERM.

    Parameters
    ----------
    master_key_file
        The cluster's master key file.
    advertise
        IP address other servers and nodes reach this server on.
    san
        Another name nodes use to reach the edge (repeat for several).
    listen
        Address to bind (default 0.0.0.0; with --dev, the advertise address).
    reconcile_every
        Seconds between the edge's checks that every streamed node is still accepted, the
        backstop for a lost notification (0.1 to 60).
    max_pending_nodes
        Nodes that may wait for an operator at once, cluster-wide; tokenless joins beyond
        it are refused (1 to 1000000; give every server the same).
    max_web_sessions_per_person
        Web UI sessions one person may have open at once, on all servers; a sign-in past
        it is refused, 429 (1 to 10000; give every server the same).
    max_live_pages_per_person
        Live pages (web UI event streams) one person may hold on this server, whatever
        their sessions; more are refused, 429 (1 to 200).
    max_event_streams_per_person
        Streams of the audit log (`audit follow`, GET /api/v1/events) one person may hold
        on this server; more are refused, 429 (1 to 200).
    person_requests_per_second
        Requests (API calls, web UI pages and actions) one person may send this server a
        second, after a burst of --person-request-burst; more are refused, 429 with
        Retry-After (0.1 to 100000).
    person_request_burst
        Requests one person may send this server at once (1 to 100000).
    ui_cert
        Your organisation's certificate for the web UI (PEM, the server's first, then its
        chain), served to browsers instead of one from the cluster's web UI CA.
    ui_key
        The key of --ui-cert (PEM, unencrypted, mode 0600).
    """
    import trio

    from oz0.server import logs
    from oz0.server import start as server_start
    from oz0.server.systemd_notify import Notifier
    from oz0.store.dburl import DatabaseUrl

    # First: no process this one starts (dev mode's PostgreSQL) may inherit $NOTIFY_SOCKET.
    notifier = Notifier.from_env()
    if not 0.1 <= reconcile_every <= 60:
        raise Oz0Error(f"--reconcile-every must be 0.1 to 60 seconds, not {reconcile_every:g}")
    if not 1 <= max_pending_nodes <= 1_000_000:
        raise Oz0Error(f"--max-pending-nodes must be 1 to 1000000, not {max_pending_nodes}")
    limits = _person_limits(
        max_web_sessions_per_person,
        max_live_pages_per_person,
        person_requests_per_second,
        person_request_burst,
        max_event_streams_per_person,
    )
    pair = server_start.ui_pair(ui_cert, ui_key)
    if dev:
        if data_dir is None:
            raise Oz0Error("--dev needs --data-dir DIR")
        return _start_dev(
            data_dir,
            advertise or "127.0.0.1",
            san,
            listen,
            reconcile_every,
            max_pending_nodes,
            pair,
            limits,
            notifier,
            verbose=verbose,
        )
    logs.configure(verbose=verbose)
    if master_key_file is None or advertise is None:
        raise Oz0Error("server start needs --master-key-file and --advertise (or --dev --data-dir)")
    options = server_start.StartOptions(
        url=DatabaseUrl.from_env(),
        master_key_file=master_key_file,
        advertise=server_start.check_advertise(advertise),
        sans=san,
        listen=listen,
        reconcile_every=reconcile_every,
        max_pending_nodes=max_pending_nodes,
        ui_pair=pair,
        limits=limits,
    )
    cluster = server_start.prepare(options)
    trio.run(server_start.run_until_signalled, options, cluster, _print_started, notifier)
    return 0


@app.command(name="install-service")
def install_service(
    *,
    advertise: str,
    master_key_file: Path,
    san: Annotated[tuple[str, ...], Parameter(consume_multiple=False)] = (),
    listen: str | None = None,
    ui_cert: Path | None = None,
    ui_key: Path | None = None,
    env_file: Path | None = None,
    user: str | None = None,
    system: bool | None = None,
    binary: Path | None = None,
    unit_path: Path | None = None,
    force: Annotated[bool, Parameter(negative=())] = False,
    json: JsonFlag = False,
) -> int:
    """Write the systemd unit that runs this server (`systemctl enable --now oz0-server`
    next): `Type=notify`, ready once it serves; no secret in the unit.

    Parameters
    ----------
    advertise
        IP address other servers and nodes reach this server on (as `server start`).
    master_key_file
        The cluster's master key file (root's, mode 0600); systemd hands the service a
        private copy of it, the file itself stays as it is.
    san
        Another name nodes use to reach the edge (repeat for several).
    listen
        Address to bind (default 0.0.0.0).
    ui_cert
        Your organisation's certificate for the web UI (readable by the service).
    ui_key
        The key of --ui-cert (mode 0600; handed over as the master key is).
    env_file
        The environment file with OZ0_DB, mode 0600 (default
        /etc/orchestrator-zero/server.env); made from $OZ0_DB if it does not exist.
    user
        Run as this account (default: a user systemd makes for the service alone).
    system
        A system unit (the default for root) or, with --no-system, one of your user's
        systemd.
    binary
        The `orchestrator-zero` the unit starts (default: this one).
    unit_path
        Where to write the unit (default: /etc/systemd/system/oz0-server.service for root,
        ~/.config/systemd/user/oz0-server.service for others).
    force
        Replace an existing unit that differs.
    """
    import os

    from oz0 import pki
    from oz0.server import service_unit as units
    from oz0.server import start as server_start

    program = _this_program(binary)
    if not program.is_file() or not os.access(program, os.X_OK):
        raise Oz0Error(f"--binary {program} is not an executable file")
    euid = os.geteuid()
    as_system = euid == 0 if system is None else system
    if user is not None and not as_system:
        raise Oz0Error("--user goes with a system unit: a unit of your user's systemd runs as you")
    key_file = master_key_file.expanduser().absolute()
    pki.read_master_key(key_file)  # a master key, 0600, before the unit names it
    pair = server_start.ui_pair(ui_cert, ui_key)  # both or neither, and they match
    unit = units.ServerUnit(
        binary=program,
        advertise=server_start.check_advertise(advertise),
        master_key_file=key_file,
        env_file=(env_file or units.DEFAULT_ENV_FILE).expanduser().absolute(),
        sans=san,
        listen=listen,
        ui_cert=ui_cert.expanduser().absolute() if pair and ui_cert else None,
        ui_key=ui_key.expanduser().absolute() if pair and ui_key else None,
        user=user,
    )
    text = units.unit_text(unit, system=as_system)
    target = (
        unit_path.expanduser().absolute()
        if unit_path is not None
        else (units.SYSTEM_UNIT if as_system else Path.home() / units.USER_UNIT)
    )
    wrote_env = units.install_env_file(unit.env_file, os.environ.get("OZ0_DB", "").strip())
    units.install(target, text, force=force)
    scope = "" if as_system else " --user"
    if json:
        print_json(
            {
                "unit": str(target),
                "env_file": str(unit.env_file),
                "env_file_written": wrote_env,
                "exec_start": units.exec_start(unit, system=as_system),
                "system": as_system,
            }
        )
        return 0
    print(f"wrote {target}: runs {units.exec_start(unit, system=as_system)}")
    if wrote_env:
        print(f"wrote {unit.env_file} (mode 0600): OZ0_DB from your environment")
    else:
        print(f"reads OZ0_DB from {unit.env_file}")
    print(f"next: systemctl{scope} daemon-reload && systemctl{scope} enable --now oz0-server")
    return 0


def _this_program(binary: Path | None) -> Path:
    """BINARY, else this `orchestrator-zero` console script (not `python -m cli.main`)."""
    if binary is not None:
        return binary.expanduser().absolute()
    launcher = Path(sys.argv[0])
    if launcher.name != "orchestrator-zero":
        raise Oz0Error("this is not the `orchestrator-zero` command itself; give --binary PATH")
    return launcher.expanduser().absolute()


def _person_limits(
    web_sessions: int, live_pages: int, per_second: float, burst: int, event_streams: int
) -> PersonLimits:
    """The flags' caps on one person, each within its bounds (else one line, exit 1)."""
    from oz0.server.audit_follow import MAX_STREAMS as MAX_EVENT_STREAMS
    from oz0.server.person_limits import PersonLimits
    from oz0.web.live import MAX_STREAMS

    for flag, value, low, high in (
        ("--max-web-sessions-per-person", web_sessions, 1, 10_000),
        ("--max-live-pages-per-person", live_pages, 1, MAX_STREAMS),
        ("--person-requests-per-second", per_second, 0.1, 100_000),
        ("--person-request-burst", burst, 1, 100_000),
        ("--max-event-streams-per-person", event_streams, 1, MAX_EVENT_STREAMS),
    ):
        if not low <= value <= high:
            raise Oz0Error(f"{flag} must be {low:g} to {high:g}, not {value:g}")
    return PersonLimits(web_sessions, live_pages, per_second, burst, event_streams)


def _start_dev(
    data_dir: Path,
    advertise: str,
    sans: tuple[str, ...],
    listen: str | None,
    reconcile_every: float,
    max_pending_nodes: int,
    ui_pair: tls.UiPair | None,
    limits: PersonLimits,
    notifier: Notifier,
    *,
    verbose: bool,
) -> int:
    import trio

    from oz0 import cluster_init, devmode
    from oz0.server import logs
    from oz0.server import start as server_start

    data_dir = data_dir.resolve()
    server_start.check_advertise(advertise)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_dir = devmode.log_dir(data_dir)
    logs.configure(verbose=verbose, log_dir=log_dir)
    key_file = devmode.master_key_path(data_dir)
    with devmode.embedded_postgres(data_dir) as url:
        password = None
        if not key_file.exists():
            _progress(f"creating the dev cluster in {data_dir} (first start only)")
            result = cluster_init.init_cluster(
                url,
                cluster_name=devmode.DEV_CLUSTER,
                history_shards=devmode.DEV_HISTORY_SHARDS,
                master_key_out=key_file,
                context_dir=devmode.context_dir(data_dir),
                advertise=advertise,
                visibility_sqlite=devmode.visibility_sqlite(data_dir),
                progress=log.info,
            )
            password = result.ui_password
        options = server_start.StartOptions(
            url=url,
            master_key_file=key_file,
            advertise=advertise,
            sans=sans,
            listen=listen,
            listen_default=advertise,
            visibility_sqlite=devmode.visibility_sqlite(data_dir),
            reconcile_every=reconcile_every,
            max_pending_nodes=max_pending_nodes,
            ui_pair=ui_pair,
            limits=limits,
        )
        cluster = server_start.prepare(options)

        def started(running: server_start.Running) -> None:
            _print_started(running)
            print(f"web UI:    {running.management_url}")
            if password:
                print(
                    f"web UI account admin, password {password}  (shown only on this first start)"
                )
            print(f"CA hash:   {running.cluster.ca_hash}")
            print(f"logs:      {log_dir}  (--verbose prints them here)")
            print(f"export OZ0_CONTEXT={devmode.context_dir(data_dir) / 'context.json'}")
            sys.stdout.flush()

        trio.run(server_start.run_until_signalled, options, cluster, started, notifier)
    return 0


def _print_started(running: server_start.Running) -> None:
    print(
        f"server {running.server_id} of cluster {running.cluster.name} is up: "
        f"management {running.management_url}, edge {running.edge_address}"
    )
    sys.stdout.flush()


@contextlib.contextmanager
def _dev_database(data_dir: Path | None) -> Iterator[tuple[DatabaseUrl, Path]]:
    """The dev cluster's embedded PostgreSQL in DATA_DIR, running while in use."""
    from oz0 import devmode

    if data_dir is None:
        raise Oz0Error("--dev needs --data-dir DIR")
    data_dir = data_dir.resolve()
    warnings.filterwarnings("ignore", module="platformdirs")
    with devmode.embedded_postgres(data_dir) as url:
        yield url, data_dir


@operator_app.command
def issue(
    name: str,
    *,
    master_key_file: Path | None = None,
    operator_dir: Path | None = None,
    advertise: str | None = None,
    dev: DevFlag = False,
    data_dir: DataDir = None,
    json: JsonFlag = False,
) -> int:
    """Make new credentials for operator NAME (adding it if the cluster lacks it).

    Parameters
    ----------
    name
        The operator's name.
    master_key_file
        The cluster's master key file.
    operator_dir
        Directory of the CLI context to write; an existing context keeps its addresses.
    advertise
        Server address a new context points at.
    """
    from oz0 import devmode
    from oz0.operator_issue import issue_operator
    from oz0.store.dburl import DatabaseUrl

    if advertise is not None:
        check_address(advertise)
    if dev:
        with _dev_database(data_dir) as (url, data_dir):
            issued = issue_operator(
                url,
                master_key_file=devmode.master_key_path(data_dir),
                name=name,
                operator_dir=operator_dir or devmode.context_dir(data_dir),
                advertise=advertise or devmode.server_address(data_dir),
            )
    else:
        if master_key_file is None or operator_dir is None:
            raise Oz0Error("server operator issue needs --master-key-file and --operator-dir")
        issued = issue_operator(
            DatabaseUrl.from_env(),
            master_key_file=master_key_file,
            name=name,
            operator_dir=operator_dir,
            advertise=advertise,
        )
    if json:
        print_json(
            {
                "operator": name,
                "cluster": issued.context.cluster,
                "context": str(issued.context.path),
                "not_after": issued.not_after,
            }
        )
    else:
        print(
            f"operator {name} of cluster {issued.context.cluster}: credentials valid until "
            f"{issued.not_after}"
        )
        print(f"export OZ0_CONTEXT={issued.context.path}")
    return 0


@app.command(name="ui-password")
def ui_password(
    account: str,
    *,
    master_key_file: Path | None = None,
    dev: DevFlag = False,
    data_dir: DataDir = None,
    json: JsonFlag = False,
) -> int:
    """Reset web UI account ACCOUNT's lost password: prints a new one, once, and ends the
    account's sessions on every server.

    Parameters
    ----------
    account
        The web UI account, such as admin.
    master_key_file
        The cluster's master key file.
    """
    from oz0 import devmode, ui_accounts
    from oz0.store.dburl import DatabaseUrl

    if dev:
        with _dev_database(data_dir) as (url, data_dir):
            password = ui_accounts.reset(
                url, master_key_file=devmode.master_key_path(data_dir), username=account
            )
    else:
        if master_key_file is None:
            raise Oz0Error("server ui-password needs --master-key-file")
        password = ui_accounts.reset(
            DatabaseUrl.from_env(), master_key_file=master_key_file, username=account
        )
    if json:
        print_json({"ui_account": account, "ui_password": password})
    else:
        print(f"web UI account {account}: new password {password}  (shown only now)")
        print("its sessions have ended on every server; sign in again with it")
    return 0
