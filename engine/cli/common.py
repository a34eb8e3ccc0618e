"""What the command modules share: the configuration and database of the click context,
the one-line failure, running a query (and failing on a refused one), table or JSON output,
the ``--json`` option, dates and JSON objects typed on the command line, who is acting, and
the cipher of stored secrets.

Imports no other module of ``engine.cli``: every command module may import it. What only
some commands need (the database, the timetables, the cipher) is imported when first used,
so that loading a command costs only what it runs.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, NoReturn

import click

from engine.exceptions import OperatorActionError, SluiceError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import tzinfo
    from pathlib import Path

    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.crypto import KwargsCipher
    from engine.db.database import Database

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def fail(message: str) -> NoReturn:
    """End the command with ``error: <message>`` on stderr and exit code 1."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def get_config(ctx: click.Context) -> Config:
    """The configuration, loaded once per invocation; loading it configures logging (with the
    root group's ``--log-level`` / ``--log-format`` overrides). A bad configuration fails."""
    cfg: Config | None = ctx.obj.get("config") if ctx.obj else None
    if cfg is None:
        from engine.config import load_config
        from engine.logs import configure_logging

        try:
            cfg = load_config()
        except SluiceError as exc:
            fail(str(exc))
        ctx.ensure_object(dict)["config"] = cfg
        configure_logging(
            ctx.obj.get("log_level") or cfg.logging.level,
            ctx.obj.get("log_format") or cfg.logging.format,
            secrets=cfg.secret_values(),
        )
    return cfg


def open_database(ctx: click.Context, *, writes: bool = True) -> Database:
    """A new ``Database`` on ``[core] sql_alchemy_conn``; the caller disposes of it.

    ``writes=False``: the command only reads, and must not create a database where there is
    none (SQLite creates its file on the first connect): with no file at the configured
    path the command fails, saying where it looked, which settings led there, and how to
    create one; a second terminal without the engine's ``SLUICE_HOME`` would otherwise get
    an empty database of its own.
    """
    from engine.db.database import Database

    cfg = get_config(ctx)
    if not writes:
        require_database(cfg)
    return Database(cfg.core.sql_alchemy_conn)


def require_database(cfg: Config) -> None:
    """Fail a command that only reads when there is no database to read (see
    ``missing_database``), before it creates anything: neither the file, nor the home's
    directory, nor a Fernet key file."""
    if (missing := missing_database(cfg)) is not None:
        fail(
            f"no database exists at {missing}\n{database_settings(cfg)}\n"
            "  A command that only reads does not create one. Create it with `sluice db "
            "migrate` (with these settings), or point SLUICE_HOME or [core] sql_alchemy_conn "
            "at the database the engine uses (`sluice config show` in its terminal shows it)."
        )


def missing_database(cfg: Config) -> Path | None:
    """The path of a SQLite database that does not exist (nothing to read), else None."""
    from engine.db.database import sqlite_file

    path = sqlite_file(cfg.core.sql_alchemy_conn)
    return None if path is None or path.exists() else path


def _named(cfg: Config) -> str:
    """The database as a person names it: ``at <file>`` for SQLite, else its URL."""
    from engine.db.database import sqlite_file

    path = sqlite_file(cfg.core.sql_alchemy_conn)
    return f"at {path}" if path is not None else cfg.as_dict()["core"]["sql_alchemy_conn"]


def database_settings(cfg: Config) -> str:
    """The settings that chose the database, each with where it came from (indented lines)."""
    url = cfg.as_dict(redact=True)["core"]["sql_alchemy_conn"]
    source = cfg.sources.get(("core", "sql_alchemy_conn"), "default")
    came = "default: $SLUICE_HOME/sluice.db" if source == "default" else f"from {source}"
    found = "" if cfg.config_file.is_file() else " (not found)"
    return (
        f"  [core] sql_alchemy_conn = {url} ({came})\n"
        f"  SLUICE_HOME = {cfg.home} (from {cfg.home_source})\n"
        f"  config file: {cfg.config_file}{found}"
    )


def run_query(ctx: click.Context, fn: Any, *, writes: bool = False) -> Any:
    """``fn(session)`` in one transaction; one that only reads does not hold up the engine's
    writers (SQLite: no write lock) and never creates a database (``open_database``). A
    refused operator action ends the command with its message; a database error with its
    first line, or, when the database has no schema at all, with how to create it."""
    db = open_database(ctx, writes=writes)
    try:
        return db.call(fn, read_only=not writes)
    except OperatorActionError as exc:
        fail(str(exc))
    except SluiceError as exc:
        fail(_unreadable(get_config(ctx), db, exc))
    finally:
        db.dispose()


def _unreadable(cfg: Config, db: Database, exc: SluiceError) -> str:
    """What to say when ``db`` refused a query: an unmigrated database (an empty SQLite
    file, a PostgreSQL database without tables) says so; anything else gives its first
    line."""
    from engine.db.schema import current_revision

    try:
        migrated = current_revision(db.engine) is not None
    except SluiceError:  # unreachable, refused: the first error says it
        migrated = True
    if not migrated:
        return (
            f"the database {_named(cfg)} has no Sluice schema (never migrated)\n"
            f"{database_settings(cfg)}\n"
            "  Create the schema with `sluice db migrate` (with these settings), or point "
            "SLUICE_HOME or [core] sql_alchemy_conn at the database the engine uses."
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return (
        f"{first} (database {db!r}; check [core] sql_alchemy_conn and that the schema is "
        "current: `sluice db check`, `sluice db migrate`)"
    )


def run_refusable(
    ctx: click.Context,
    fn: Callable[[Session], Any],
    refused: type[SluiceError],
    *,
    writes: bool = False,
) -> Any:
    """``run_query``, where a ``refused`` error that ``fn`` raises (a user that exists
    already, a value no key decrypts) ends the command with its own message, not a database
    hint; the transaction ends normally first."""
    problem: list[SluiceError] = []

    def guarded(session: Session) -> Any:
        try:
            return fn(session)
        except refused as exc:
            problem.append(exc)
            return None

    result = run_query(ctx, guarded, writes=writes)
    if problem:
        fail(str(problem[0]))
    return result


def kwargs_cipher(ctx: click.Context, *, writes: bool = True) -> KwargsCipher:
    """The cipher of stored secrets, from ``[core] fernet_key`` (or the home's key file,
    made if missing); a bad key fails. ``writes=False``: for a command that only reads,
    which fails first when there is no database (``require_database``)."""
    from engine.crypto import KwargsCipher

    cfg = get_config(ctx)
    if not writes:
        require_database(cfg)
    try:
        return KwargsCipher.from_config(cfg.core.fernet_key, cfg.home)
    except SluiceError as exc:
        fail(str(exc))


def cli_actor() -> str:
    """Who acts from this command line: ``cli:<user>@<host>`` (an event's ``created_by``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def parse_json_object(text: str | None, option: str) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object (None when not given); anything else fails."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not JSON: {exc}")
    if not isinstance(value, dict):
        kind = _JSON_TYPES.get(type(value), type(value).__name__)
        fail(f"{option} must be a JSON object ({{...}}), got {kind}: {text}")
    return value


#: what a JSON value is called in JSON's own terms (``null``, not ``NoneType``)
_JSON_TYPES: Final[dict[type, str]] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def parse_date(text: str, *, timezone: tzinfo, option: str) -> datetime:
    """An ISO date or datetime typed on the command line, as aware UTC; a naive one is in
    ``timezone`` (the DAG's)."""
    from engine.authoring.timetables import to_utc

    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        fail(
            f"{option} {text!r} is not an ISO date or datetime "
            "(e.g. 2026-01-31, 2026-01-31T06:00, 2026-01-31T06:00:00+01:00)"
        )
    try:
        return to_utc(value, timezone=timezone, where="the command line", name=option)
    except ValueError as exc:  # DagDefinitionError: a bad timezone or value
        fail(str(exc))


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as a text table: upper-case headers, one left-aligned column per name."""
    cells = [[format_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def format_cell(value: Any) -> str:
    """One table cell: ``-`` for nothing, JSON for a dict or list, else ``str``."""
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    """Print ``rows``: as a JSON list, or as a table of ``columns`` (``(none)`` if empty)."""
    if as_json:
        click.echo(json.dumps(list(rows), indent=2, default=str))
    elif rows:
        click.echo(format_table(rows, columns))
    else:
        click.echo("(none)")
