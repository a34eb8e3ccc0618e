"""Connections and variables (tables ``connection`` and ``variable``).

Secrets are stored only encrypted with the engine's Fernet key (``engine.crypto``): a
connection's ``password`` and ``extra`` (its JSON text), a variable's value. Reads return
plain data (``Connection.to_dict()`` fields); a token no configured key decrypts is a
``DecryptionError`` naming the connection or variable, never a traceback.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from engine.db.models import StoredConnection, StoredVariable, utcnow
from engine.exceptions import DecryptionError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher

_PLAIN_FIELDS = ("conn_type", "description", "host", "schema", "login", "port")


def _decrypt(cipher: KwargsCipher, token: str | None, what: str) -> str | None:
    if token is None:
        return None
    try:
        return cipher.decrypt(token)
    except DecryptionError as exc:
        raise DecryptionError(
            f"{what}: cannot decrypt it with [core] fernet_key: {_hint(exc)}"
        ) from exc


def _hint(exc: DecryptionError) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if ": " in text else text


# --- connections ------------------------------------------------------------------------


def upsert_connection(
    session: Session, cipher: KwargsCipher, conn_id: str, fields: Mapping[str, Any]
) -> bool:
    """Create or replace connection ``conn_id`` from ``Connection.to_dict()`` fields; True
    when it was created."""
    row = session.execute(
        select(StoredConnection).where(StoredConnection.conn_id == conn_id)
    ).scalar_one_or_none()
    created = row is None
    if row is None:
        row = StoredConnection(conn_id=conn_id)
        session.add(row)
    for name in _PLAIN_FIELDS:
        setattr(row, name, fields.get(name))
    row.conn_type = fields.get("conn_type") or ""
    password = fields.get("password")
    row.password = None if password is None else cipher.encrypt(password)
    extra = fields.get("extra")
    row.extra = cipher.encrypt(json.dumps(extra)) if extra else None
    row.updated_at = utcnow()
    session.flush()
    return created


def connection_exists(session: Session, conn_id: str) -> bool:
    query = select(StoredConnection.id).where(StoredConnection.conn_id == conn_id)
    return session.execute(query).first() is not None


def _connection_fields(cipher: KwargsCipher, row: StoredConnection) -> dict[str, Any]:
    what = f"connection {row.conn_id!r}"
    extra = _decrypt(cipher, row.extra, f"{what} (its extra)")
    out: dict[str, Any] = {name: getattr(row, name) for name in _PLAIN_FIELDS}
    out["password"] = _decrypt(cipher, row.password, f"{what} (its password)")
    out["extra"] = json.loads(extra) if extra else {}
    return out


def get_connection(session: Session, cipher: KwargsCipher, conn_id: str) -> dict[str, Any] | None:
    """The fields of connection ``conn_id`` (secrets decrypted), or None."""
    row = session.execute(
        select(StoredConnection).where(StoredConnection.conn_id == conn_id)
    ).scalar_one_or_none()
    return None if row is None else _connection_fields(cipher, row)


def list_connections(session: Session, cipher: KwargsCipher) -> list[tuple[str, dict[str, Any]]]:
    """Every connection as ``(conn_id, fields)``, by id."""
    rows = session.execute(select(StoredConnection).order_by(StoredConnection.conn_id))
    return [(row.conn_id, _connection_fields(cipher, row)) for row in rows.scalars()]


def delete_connection(session: Session, conn_id: str) -> bool:
    """Delete connection ``conn_id``; False when there was none."""
    result = session.execute(delete(StoredConnection).where(StoredConnection.conn_id == conn_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


# --- variables --------------------------------------------------------------------------


def set_variable(
    session: Session,
    cipher: KwargsCipher,
    key: str,
    value: str,
    description: str | None = None,
) -> bool:
    """Create or replace variable ``key``; True when it was created. A replaced variable
    keeps its description unless a new one is given."""
    row = session.execute(
        select(StoredVariable).where(StoredVariable.key == key)
    ).scalar_one_or_none()
    created = row is None
    if row is None:
        row = StoredVariable(key=key)
        session.add(row)
    row.val = cipher.encrypt(value)
    if description is not None or created:
        row.description = description
    row.updated_at = utcnow()
    session.flush()
    return created


def get_variable(session: Session, cipher: KwargsCipher, key: str) -> str | None:
    """The text of variable ``key``, or None."""
    row = session.execute(
        select(StoredVariable).where(StoredVariable.key == key)
    ).scalar_one_or_none()
    return None if row is None else _decrypt(cipher, row.val, f"variable {key!r}")


def list_variables(
    session: Session, cipher: KwargsCipher
) -> list[tuple[str, str | None, str | None]]:
    """Every variable as ``(key, value, description)``, by key."""
    rows = session.execute(select(StoredVariable).order_by(StoredVariable.key)).scalars()
    return [(r.key, _decrypt(cipher, r.val, f"variable {r.key!r}"), r.description) for r in rows]


def delete_variable(session: Session, key: str) -> int:
    """Delete variable ``key``; how many were deleted (0 or 1)."""
    result = session.execute(delete(StoredVariable).where(StoredVariable.key == key))
    return int(result.rowcount)  # type: ignore[attr-defined]


# --- key rotation -----------------------------------------------------------------------


def rotate_secrets(session: Session, cipher: KwargsCipher, failures: list[str]) -> int:
    """Re-encrypt every connection's secrets and every variable with the first key; what
    no key decrypts is added to ``failures`` (naming the connection or variable)."""
    count = 0
    for conn in session.execute(select(StoredConnection)).scalars():
        for name in ("password", "extra"):
            token = getattr(conn, name)
            if token is None:
                continue
            try:
                setattr(conn, name, cipher.rotate(token))
                count += 1
            except DecryptionError as exc:
                failures.append(f"connection {conn.conn_id!r} (its {name}): {_hint(exc)}")
    for var in session.execute(select(StoredVariable)).scalars():
        try:
            var.val = cipher.rotate(var.val)
            count += 1
        except DecryptionError as exc:
            failures.append(f"variable {var.key!r}: {_hint(exc)}")
    return count
