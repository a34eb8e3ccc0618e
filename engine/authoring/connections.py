"""Connections, as Airflow 3 tasks use them (``Connection.get(conn_id)``).

Theory of operation. A connection is looked up first in the environment
(``SLUICE_CONN_<ID>``: a URI or a JSON object; the id upper-cased, as Airflow's
``AIRFLOW_CONN_``), then in the *store* of the current process (``engine.authoring.store``:
in a task's process, its executor over the request channel). The engine's own processes
(the CLI, the triggerer resolving ``kafka_config_id`` ...) read the database directly
(``engine.db.queries.connections``) and use ``Connection`` for the forms only.

Secrets. A connection's password, the sensitive keys of its extra (``is_sensitive``, by
Airflow's sensitive names) and the value of a variable whose key looks sensitive are handed
to the store's ``mask`` as they are read, so they are replaced by ``***`` in the task log.

The URI form follows Airflow: ``postgres://user:p%40ss@host:5432/db?sslmode=require``
(each part percent-decoded; query parameters become the extra, or ``__extra__=<JSON>``
holds a non-flat extra), and ``get_uri()`` writes it back so that parsing it again gives
the same connection.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit

from engine.authoring.store import CONN_ENV_PREFIX, VAR_ENV_PREFIX, current_store, mask_secrets
from engine.exceptions import AirflowNotFoundException, SluiceError

if TYPE_CHECKING:
    from collections.abc import Iterator

EXTRA_KEY: Final = "__extra__"
MASK: Final = "***"
#: Airflow's default sensitive field names: a key containing one of them holds a secret
SENSITIVE_NAMES: Final = frozenset(
    {
        "access_token",
        "api_key",
        "apikey",
        "authorization",
        "passphrase",
        "passwd",
        "password",
        "private_key",
        "secret",
        "token",
        "keyfile_dict",
        "service_account",
    }
)
FIELDS: Final = ("conn_type", "description", "host", "schema", "login", "password", "port")


class InvalidConnectionError(SluiceError, ValueError):
    """A connection's definition (URI, JSON, fields) is malformed; names the connection."""


def is_sensitive(name: str) -> bool:
    """Whether a field, extra key or variable key names a secret (Airflow's rule)."""
    lowered = name.lower()
    return any(word in lowered for word in SENSITIVE_NAMES)


def mask_extra(extra: Any) -> Any:
    """``extra`` with the values of sensitive keys replaced by ``***`` (nested too)."""
    if isinstance(extra, dict):
        return {
            k: MASK if is_sensitive(str(k)) and v not in (None, "") else mask_extra(v)
            for k, v in extra.items()
        }
    if isinstance(extra, list):
        return [mask_extra(item) for item in extra]
    return extra


def sensitive_values(extra: Any) -> Iterator[str]:
    """The string values under sensitive keys of ``extra`` (to mask in logs)."""
    if isinstance(extra, dict):
        for key, value in extra.items():
            if is_sensitive(str(key)) and isinstance(value, str | int) and value != "":
                yield str(value)
            else:
                yield from sensitive_values(value)
    elif isinstance(extra, list):
        for item in extra:
            yield from sensitive_values(item)


class Connection:
    """A named connection: type, host, schema, login, password, port and an extra (JSON)."""

    conn_id: str
    conn_type: str
    description: str | None
    host: str | None
    login: str | None
    password: str | None
    schema: str | None
    port: int | None
    extra: str | None

    def __init__(
        self,
        conn_id: str,
        conn_type: str | None = None,
        description: str | None = None,
        host: str | None = None,
        login: str | None = None,
        password: str | None = None,
        schema: str | None = None,
        port: int | None = None,
        extra: str | Mapping[str, Any] | None = None,
        uri: str | None = None,
    ) -> None:
        if uri is not None:
            if any(v is not None for v in (conn_type, host, login, password, schema, port)):
                raise InvalidConnectionError(
                    f"connection {conn_id!r}: give either a URI or the fields, not both"
                )
            parsed = Connection.from_uri(conn_id, uri)
            conn_type, host, login = parsed.conn_type, parsed.host, parsed.login
            password, schema, port = parsed.password, parsed.schema, parsed.port
            extra = extra if extra is not None else parsed.extra
        self.conn_id = conn_id
        self.conn_type = conn_type or ""
        self.description = description
        self.host = host
        self.login = login
        self.password = password
        self.schema = schema
        self.port = _port(conn_id, port)
        self.extra = _extra_text(conn_id, extra)

    def __repr__(self) -> str:
        return f"<Connection {self.conn_id} type={self.conn_type!r} host={self.host!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Connection) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def extra_dejson(self) -> dict[str, Any]:
        """The extra as a dict (``{}`` when empty)."""
        if not self.extra:
            return {}
        value = json.loads(self.extra)
        return value if isinstance(value, dict) else {}

    # --- lookup (Airflow's API) ------------------------------------------------------------

    @classmethod
    def get(cls, conn_id: str) -> Connection:
        """The connection ``conn_id``: from ``SLUICE_CONN_<ID>``, else from the store.

        ``AirflowNotFoundException`` when it is defined nowhere."""
        conn = connection_from_env(conn_id)
        if conn is not None:
            mask_secrets(list(conn.secrets()))
            return conn
        fields = current_store(f"Connection.get({conn_id!r})").get_connection(conn_id)
        if fields is None:
            raise AirflowNotFoundException(
                f"The conn_id `{conn_id}` isn't defined (neither by `sluice connections add` "
                f"nor by the environment variable {conn_env_name(conn_id)})"
            )
        return cls.from_dict(conn_id, fields)

    get_connection_from_secrets = get

    # --- the forms ------------------------------------------------------------------------

    @classmethod
    def from_uri(cls, conn_id: str, uri: str) -> Connection:
        """Parse Airflow's URI form; ``InvalidConnectionError`` naming ``conn_id`` if malformed."""
        if uri.count("://") > 2:
            raise InvalidConnectionError(
                f"connection {conn_id!r}: invalid URI, it has more than two '://' separators"
            )
        scheme, sep, rest = uri.partition("://")
        if not sep or not scheme:
            raise InvalidConnectionError(
                f"connection {conn_id!r}: invalid URI, expected 'type://[login[:password]@]"
                "host[:port][/schema][?extra]'"
            )
        protocol, _, _ = rest.partition("://") if "://" in rest else ("", "", "")
        if protocol:
            rest = rest[len(protocol) + 3 :]
        parts, port = _split(conn_id, rest)
        host = unquote(parts.hostname) if parts.hostname else None
        if protocol:
            host = f"{protocol}://{host or ''}"
        return cls(
            conn_id,
            conn_type=_conn_type_of_scheme(scheme),
            host=host,
            login=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            schema=unquote(parts.path[1:]) if parts.path[1:] else None,
            port=port,
            extra=_extra_of_query(conn_id, parts.query),
        )

    def get_uri(self) -> str:
        """Airflow's URI form; ``Connection.from_uri`` of it gives this connection back."""
        conn_type = (self.conn_type or "").lower().replace("_", "-")
        uri = f"{conn_type}://"
        host = self.host or ""
        if "://" in host:
            protocol, host = host.split("://", 1)
            uri += f"{protocol}://"
        if self.login is not None or self.password is not None:
            uri += quote(self.login or "", safe="")
            if self.password is not None:
                uri += ":" + quote(self.password, safe="")
            uri += "@"
        uri += quote(host, safe="")
        if self.port is not None:
            uri += f":{self.port}"
        if self.schema:
            uri += "/" + quote(self.schema, safe="")
        extra = self.extra_dejson
        if extra:
            if all(isinstance(v, str) for v in extra.values()) and EXTRA_KEY not in extra:
                uri += "?" + urlencode(extra)
            else:
                uri += f"?{EXTRA_KEY}=" + quote(json.dumps(extra), safe="")
        return uri

    @classmethod
    def from_json(cls, conn_id: str, text: str) -> Connection:
        """Parse Airflow's JSON form (``{"conn_type": ..., "host": ..., "extra": {...}}``)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidConnectionError(
                f"connection {conn_id!r}: invalid JSON{_where(exc)}"
            ) from None
        if not isinstance(data, dict):
            raise InvalidConnectionError(f"connection {conn_id!r}: the JSON form must be an object")
        return cls.from_dict(conn_id, data)

    @classmethod
    def from_dict(cls, conn_id: str, data: Mapping[str, Any]) -> Connection:
        unknown = sorted(set(data) - {*FIELDS, "extra", "conn_id", "uri"})
        if unknown:
            raise InvalidConnectionError(
                f"connection {conn_id!r}: unknown field(s) {_names(unknown)}; expected "
                f"{', '.join((*FIELDS, 'extra'))}"
            )
        fields = {k: data.get(k) for k in FIELDS}
        if data.get("uri"):
            return cls(conn_id, uri=str(data["uri"]), description=fields["description"])
        return cls(conn_id, extra=data.get("extra"), **fields)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (``extra`` as a dict); secrets included."""
        out: dict[str, Any] = {name: getattr(self, name) for name in FIELDS}
        out["extra"] = self.extra_dejson
        return out

    def masked_dict(self) -> dict[str, Any]:
        """``to_dict()`` fit to show: password and sensitive extra values as ``***``."""
        out = self.to_dict()
        if out["password"]:
            out["password"] = MASK
        out["extra"] = mask_extra(out["extra"])
        return {"conn_id": self.conn_id, **out}

    def masked_uri(self) -> str:
        """``get_uri()`` fit to show: secrets as ``***``."""
        masked = Connection.from_dict(self.conn_id, self.masked_dict())
        return masked.get_uri().replace(quote(MASK, safe=""), MASK)

    def secrets(self) -> Iterator[str]:
        """Every secret of the connection (its password, sensitive extra values)."""
        if self.password:
            yield self.password
        yield from sensitive_values(self.extra_dejson)


# --- the environment ---------------------------------------------------------------------


def conn_env_name(conn_id: str) -> str:
    return CONN_ENV_PREFIX + conn_id.upper()


def var_env_name(key: str) -> str:
    return VAR_ENV_PREFIX + key.upper()


def parse_connection(conn_id: str, text: str) -> Connection:
    """A connection from its URI or JSON form (JSON when it starts with ``{``)."""
    text = text.strip()
    if text.startswith("{"):
        return Connection.from_json(conn_id, text)
    return Connection.from_uri(conn_id, text)


def connection_from_env(
    conn_id: str, environ: Mapping[str, str] | None = None
) -> Connection | None:
    """The connection ``SLUICE_CONN_<ID>`` defines, or None."""
    name = conn_env_name(conn_id)
    text = (os.environ if environ is None else environ).get(name)
    if text is None:
        return None
    try:
        return parse_connection(conn_id, text)
    except InvalidConnectionError as exc:
        raise InvalidConnectionError(f"environment variable {name}: {exc}") from exc


# --- helpers ------------------------------------------------------------------------------


def _conn_type_of_scheme(scheme: str) -> str:
    conn_type = scheme.replace("-", "_").lower()
    return "postgres" if conn_type == "postgresql" else conn_type


def _extra_of_query(conn_id: str, query: str) -> dict[str, Any] | None:
    if not query:
        return None
    pairs = dict(parse_qsl(query, keep_blank_values=True))
    if EXTRA_KEY not in pairs:
        return pairs
    if len(pairs) > 1:
        raise InvalidConnectionError(
            f"connection {conn_id!r}: invalid URI, {EXTRA_KEY} must be the only query parameter"
        )
    try:
        extra = json.loads(pairs[EXTRA_KEY])
    except ValueError as exc:
        raise InvalidConnectionError(
            f"connection {conn_id!r}: {EXTRA_KEY} is not valid JSON{_where(exc)}"
        ) from None
    if not isinstance(extra, dict):
        raise InvalidConnectionError(f"connection {conn_id!r}: {EXTRA_KEY} must be a JSON object")
    return extra


def _extra_text(conn_id: str, extra: str | Mapping[str, Any] | None) -> str | None:
    if extra is None or extra == "" or extra == {}:
        return None
    if isinstance(extra, str):
        try:
            value = json.loads(extra)
        except ValueError as exc:
            raise InvalidConnectionError(
                f"connection {conn_id!r}: extra is not valid JSON{_where(exc)}"
            ) from None
        if not isinstance(value, dict):
            raise InvalidConnectionError(f"connection {conn_id!r}: extra must be a JSON object")
        return extra
    if not isinstance(extra, Mapping):
        raise InvalidConnectionError(f"connection {conn_id!r}: extra must be a JSON object")
    return json.dumps(dict(extra))


def _port(conn_id: str, port: object) -> int | None:
    if port is None or port == "":
        return None
    try:
        value = int(str(port))
    except ValueError:
        raise InvalidConnectionError(
            f"connection {conn_id!r}: port must be a whole number from 1 to 65535"
        ) from None
    if not 0 < value < 65536:
        raise InvalidConnectionError(
            f"connection {conn_id!r}: port is out of range (it must be from 1 to 65535)"
        )
    return value


# --- errors that echo nothing of the input ---------------------------------------------------
#
# Any part of a connection's text may be a secret (a password with an unencoded ``/`` moves
# into the "port", the "schema" or the query), and these errors reach logs, the trigger row,
# tracebacks and the CLI before anything knows what to mask. So they name the connection and
# where the problem is, never the text: no ``{exc}`` of ``urlsplit`` or ``json.loads``, whose
# messages quote the input (``Port could not be cast to integer value as 's3cr3t'``), and
# ``from None`` so that a traceback does not print that message either.

_BAD_NETLOC: Final = (
    "invalid port, or an unencoded special character in the login or password; "
    "percent-encode it (%2F for /, %23 for #, %3F for ?, %40 for @, %3A for :)"
)


def _split(conn_id: str, rest: str) -> tuple[SplitResult, int | None]:
    """``urlsplit`` of the URI after its scheme, and its port; errors quote nothing of it.

    A password with an unencoded ``/``, ``#`` or ``?`` ends the authority early: the text
    after ``user:`` becomes the "port" (an error) and the rest, with its ``@``, the path,
    query or fragment (a silent misparse that would store part of the password in clear
    as the schema or extra). Both are the same error, with the remedy."""
    try:
        parts = urlsplit(f"x://{rest}")
        port = parts.port
    except ValueError:
        raise InvalidConnectionError(
            f"connection {conn_id!r}: invalid URI: {_BAD_NETLOC}"
        ) from None
    query_keys = (pair.partition("=")[0] for pair in re.split("[&;]", parts.query))
    if "@" in parts.path or "@" in parts.fragment or any("@" in key for key in query_keys):
        raise InvalidConnectionError(
            f"connection {conn_id!r}: invalid URI, an '@' after the host: {_BAD_NETLOC} "
            "(or %40 for an @ in the schema)"
        )
    return parts, port


def _where(exc: ValueError) -> str:
    """Where a JSON text is malformed (line and column), without quoting it."""
    if isinstance(exc, json.JSONDecodeError):
        what = exc.msg.partition(":")[0]  # "Invalid \\escape: 'x'" quotes the text
        return f" ({what} at line {exc.lineno}, column {exc.colno})"
    return ""


def _names(keys: list[str]) -> str:
    """Unknown field names, quoted only when they look like names (a mangled JSON could
    turn a value into a key); the others counted."""
    shown = [k for k in keys if isinstance(k, str) and k.isidentifier() and len(k) <= 32]
    hidden = len(keys) - len(shown)
    return ", ".join([*shown, *([f"{hidden} not shown"] if hidden else [])])
