"""Credentials without the web: roles, password hashes, API tokens and session secrets.

Imports no web framework, so the CLI (``sluice users``, ``sluice tokens``) uses the same
rules as the API server.

- Passwords are hashed with Argon2id (argon2-cffi's defaults, the RFC 9106 "low memory"
  profile): slow and salted on purpose, since passwords are guessable.
- API tokens and session cookies are 256-bit random values from ``secrets``; only their
  SHA-256 is stored. A fast unsalted hash is enough there (nobody can guess 2**256 values,
  so there is nothing to slow down) and, unlike a salted hash, it can be looked up by an
  index in one query.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from datetime import timedelta
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from engine.exceptions import SluiceError

ADMIN: Final = "admin"
OPERATOR: Final = "op"
VIEWER: Final = "viewer"
#: Lowest to highest: each role may do what the ones before it may.
ROLES: Final[tuple[str, ...]] = (VIEWER, OPERATOR, ADMIN)

TOKEN_PREFIX: Final = "sluice_"
TOKEN_BYTES: Final = 32
TOKEN_SHOWN_CHARS: Final = 12  # how much of a token listings show, to tell tokens apart
MIN_PASSWORD_LENGTH: Final = 8
MAX_PASSWORD_LENGTH: Final = 1024  # hashing a huge "password" is a denial of service
USERNAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,249}$")
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest lifetime a duration (a token's ``--expires-in``) may give: past it, dates
#: overflow, and a token meant to last longer should be made without expiry by an admin.
MAX_DURATION: Final = timedelta(days=3650)

_hasher: Final = PasswordHasher()


class CredentialError(SluiceError):
    """A username, role, password or duration that cannot be used; the message says why."""


def role_at_least(role: str, needed: str) -> bool:
    """Whether ``role`` may do what ``needed`` may (admin > op > viewer)."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(needed)


def check_username(username: str) -> str:
    if not USERNAME_PATTERN.match(username):
        raise CredentialError(
            f"invalid username {username!r}: 1 to 250 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit"
        )
    return username


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise CredentialError(f"the password must have at least {MIN_PASSWORD_LENGTH} characters")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise CredentialError(f"the password must have at most {MAX_PASSWORD_LENGTH} characters")
    return password


def hash_password(password: str) -> str:
    """An Argon2id hash of ``password`` (after ``check_password``)."""
    return _hasher.hash(check_password(password))


def verify_password(stored_hash: str, password: str) -> bool:
    """Whether ``password`` matches ``stored_hash``; a malformed hash never matches."""
    if len(password) > MAX_PASSWORD_LENGTH:
        return False
    try:
        return _hasher.verify(stored_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(stored_hash: str) -> bool:
    """Whether a hash was made with weaker parameters than the current ones."""
    try:
        return _hasher.check_needs_rehash(stored_hash)
    except InvalidHashError:
        return True


@functools.cache
def _dummy_hash() -> str:
    return _hasher.hash(secrets.token_urlsafe(16))


def verify_unknown_user(password: str) -> bool:
    """Spend the time of a password check for a user that does not exist (always False), so
    that the response time does not tell which usernames exist."""
    verify_password(_dummy_hash(), password)
    return False


def new_secret() -> str:
    """A new 256-bit random value, URL-safe (session cookies, CSRF tokens)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def new_token() -> str:
    """A new API token: ``sluice_`` and 256 random bits; shown once, stored hashed."""
    return TOKEN_PREFIX + new_secret()


def digest(secret: str) -> str:
    """The stored form of a token or session value: SHA-256, hex (see the module doc)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def shown_prefix(token: str) -> str:
    """The part of a token that listings show (not enough to use it)."""
    return token[:TOKEN_SHOWN_CHARS]


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` as a positive ``timedelta`` of at most
    ``MAX_DURATION`` (10 years)."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise CredentialError(
            f"invalid duration {text!r}: a positive number and a unit s, m, h, d or w "
            "(e.g. 30d, 12h)"
        )
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_DURATION.total_seconds():
        raise CredentialError(
            f"duration {text!r} is too long: at most {MAX_DURATION.days}d (10 years)"
        )
    return timedelta(seconds=seconds)
