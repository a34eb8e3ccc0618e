"""What every command module shares: the configuration and database of the click context,
the one-line failure, table or JSON output, and the ``--json`` option.

Imports no other module of ``engine.cli``: every command module may import it.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from engine.exceptions import OperatorActionError, SluiceError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.config import Config
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


def open_database(ctx: click.Context) -> Database:
    """A new ``Database`` on ``[core] sql_alchemy_conn``; the caller disposes of it."""
    from engine.db.database import Database

    return Database(get_config(ctx).core.sql_alchemy_conn)


def run_query(ctx: click.Context, fn: Any, *, writes: bool = False) -> Any:
    """``fn(session)`` in one transaction; one that only reads does not hold up the engine's
    writers (SQLite: no write lock). A refused operator action ends the command with its
    message; a database error with its first line."""
    db = open_database(ctx)
    try:
        return db.call(fn, read_only=not writes)
    except OperatorActionError as exc:
        fail(str(exc))
    except SluiceError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        fail(
            f"{first} (database {db!r}; check [core] sql_alchemy_conn and that the schema is "
            "current: `sluice db check`, `sluice db migrate`)"
        )
    finally:
        db.dispose()


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
