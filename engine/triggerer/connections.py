"""Connection ids in trigger kwargs (``kafka_config_id``, ``aws_conn_id``), resolved when the
triggerer builds the trigger.

A trigger class declares the kwargs that name a connection (``connection_kwargs``) and how a
connection maps to its settings (``connection_settings``); the trigger row stores only the
id. ``resolve_connections`` looks each id up (``SLUICE_CONN_<ID>`` first, then the metadata
database, in the worker thread that loads the claimed rows) and returns the kwargs updated
with the settings. A connection that is missing, undecryptable or unfit is a
``TriggerLoadError`` naming the watcher, the trigger and the connection id: that trigger
fails to load (and is retried as any load failure), the others keep running, and no event
is consumed meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.authoring.connections import (
    InvalidConnectionError,
    conn_env_name,
    connection_from_env,
)
from engine.db.queries import connections as store
from engine.exceptions import DecryptionError, TriggerLoadError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from triggers.base import BaseTrigger


def database_lookup(db: Database, cipher: KwargsCipher) -> Callable[[str], dict[str, Any] | None]:
    """A lookup for worker threads: the environment first, then the metadata database."""

    def lookup(conn_id: str) -> dict[str, Any] | None:
        conn = connection_from_env(conn_id)
        if conn is not None:
            return conn.to_dict()
        return db.call(
            lambda session: store.get_connection(session, cipher, conn_id), read_only=True
        )

    return lookup


def resolve_connections(
    cls: type[BaseTrigger],
    kwargs: Mapping[str, Any],
    lookup: Callable[[str], dict[str, Any] | None],
    *,
    where: str,
) -> dict[str, Any]:
    """``kwargs`` updated by the settings of each connection they name; ``where`` names the
    trigger (and its watcher) in errors."""
    resolved = dict(kwargs)
    for name in getattr(cls, "connection_kwargs", ()):
        conn_id = kwargs.get(name)
        if conn_id is None:
            continue
        about = f"{where}: connection {conn_id!r} (its {name})"
        try:
            fields = lookup(str(conn_id))
        except (InvalidConnectionError, DecryptionError) as exc:
            raise TriggerLoadError(f"{about}: {exc}") from exc
        if fields is None:
            raise TriggerLoadError(
                f"{about} is not defined; add it with `sluice connections add {conn_id} ...` "
                f"or set {conn_env_name(str(conn_id))}"
            )
        try:
            settings = cls.connection_settings(name, {"conn_id": conn_id, **fields})
        except (ValueError, TypeError, KeyError) as exc:
            raise TriggerLoadError(f"{about} cannot configure {cls.__qualname__}: {exc}") from exc
        resolved.update(settings)
    return resolved
