"""Roles, password hashes, tokens and durations (``engine.api.credentials``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.api import credentials as c


def test_roles_are_ordered() -> None:
    assert c.role_at_least("admin", "op") and c.role_at_least("op", "op")
    assert c.role_at_least("op", "viewer") and not c.role_at_least("viewer", "op")
    assert not c.role_at_least("root", "viewer")


def test_a_password_hash_is_argon2id_salted_and_verifies() -> None:
    first, second = c.hash_password("a good password"), c.hash_password("a good password")
    assert first.startswith("$argon2id$") and first != second
    assert c.verify_password(first, "a good password")
    assert not c.verify_password(first, "a good passwore")
    assert not c.verify_password("not a hash", "a good password")
    assert not c.verify_password(first, "x" * (c.MAX_PASSWORD_LENGTH + 1))
    assert not c.needs_rehash(first) and c.needs_rehash("not a hash")
    assert c.verify_unknown_user("anything") is False


@pytest.mark.parametrize("password", ["short", "x" * (c.MAX_PASSWORD_LENGTH + 1)])
def test_a_password_out_of_bounds_is_refused(password: str) -> None:
    with pytest.raises(c.CredentialError, match="characters"):
        c.hash_password(password)


def test_tokens_are_random_and_stored_as_sha256() -> None:
    token = c.new_token()
    assert token.startswith("sluice_") and len(token) > 40 and token != c.new_token()
    assert len(c.digest(token)) == 64 and c.digest(token) == c.digest(token)
    assert token.startswith(c.shown_prefix(token)) and len(c.shown_prefix(token)) == 12


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        (" 90m ", timedelta(minutes=90)),
        ("2w", timedelta(weeks=2)),
        ("1.5h", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert c.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "3y", "soon"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(c.CredentialError, match="invalid duration"):
        c.parse_duration(text)


@pytest.mark.parametrize("name", ["ada", "ada.lovelace", "ops-bot_2", "a@b.example"])
def test_good_usernames(name: str) -> None:
    assert c.check_username(name) == name


@pytest.mark.parametrize("name", ["", " ada", "-ada", "ada lovelace", "a/b", "x" * 251])
def test_bad_usernames(name: str) -> None:
    with pytest.raises(c.CredentialError, match="invalid username"):
        c.check_username(name)


@pytest.mark.parametrize("text", ["3000000d", "99999999999999999999w", "3651d", "522w"])
def test_too_long_durations_are_refused_not_overflowed(text: str) -> None:
    with pytest.raises(c.CredentialError, match="too long: at most 3650d"):
        c.parse_duration(text)
    assert c.parse_duration("3650d") == c.MAX_DURATION
