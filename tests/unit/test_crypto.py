from __future__ import annotations

import logging
import os
import stat
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet

from engine import crypto
from engine.crypto import (
    FERNET_KEY_FILENAME,
    KwargsCipher,
    load_or_create_fernet_key,
)
from engine.exceptions import DecryptionError, EncryptionError
from triggers.exceptions import SerializationError

if TYPE_CHECKING:
    from pathlib import Path

KWARGS = {
    "password": "hunter2-very-secret",
    "when": datetime(2024, 5, 1, tzinfo=UTC),
    "topics": ("a", "b"),
}
HINT = "add the old key after the new one (comma-separated) or run `sluice db rotate-fernet-key`"


def new_key() -> str:
    return Fernet.generate_key().decode()


def test_kwargs_round_trip_and_plaintext_is_not_in_the_token() -> None:
    cipher = KwargsCipher(new_key())
    token = cipher.encrypt_kwargs(KWARGS, owner="plugins.T")
    assert token.isascii()
    assert "hunter2" not in token
    assert cipher.decrypt_kwargs(token, trigger_id=3) == KWARGS


def test_generic_encrypt_round_trip() -> None:
    cipher = KwargsCipher(new_key())
    token = cipher.encrypt("naïve secret")
    assert "secret" not in token
    assert cipher.decrypt(token) == "naïve secret"


def test_encrypt_kwargs_reports_unserializable_kwargs() -> None:
    with pytest.raises(SerializationError, match=r"kwarg 'lock' of plugins\.T"):
        KwargsCipher(new_key()).encrypt_kwargs({"lock": object()}, owner="plugins.T")


def test_rotation_with_the_old_key_second() -> None:
    old, new = new_key(), new_key()
    old_token = KwargsCipher(old).encrypt_kwargs(KWARGS, owner="T")
    both = KwargsCipher(f"{new}, {old}")
    assert both.decrypt_kwargs(old_token) == KWARGS
    rotated = both.rotate(old_token, trigger_id=1)
    assert KwargsCipher(new).decrypt_kwargs(rotated) == KWARGS
    with pytest.raises(DecryptionError):
        KwargsCipher(old).decrypt_kwargs(rotated)
    # New tokens are made with the first key only.
    assert KwargsCipher(new).decrypt(both.encrypt("x")) == "x"


def test_wrong_key_names_trigger_id_and_hints() -> None:
    token = KwargsCipher(new_key()).encrypt_kwargs(KWARGS, owner="T")
    with pytest.raises(DecryptionError) as info:
        KwargsCipher(new_key()).decrypt_kwargs(token, trigger_id=42)
    assert info.value.trigger_id == 42
    assert "trigger 42" in str(info.value)
    assert HINT in str(info.value)
    assert "[core] fernet_key" in str(info.value)


def test_rotate_with_an_unknown_key_raises_decryption_error() -> None:
    token = KwargsCipher(new_key()).encrypt("x")
    with pytest.raises(DecryptionError, match="trigger 7") as info:
        KwargsCipher(new_key()).rotate(token, trigger_id=7)
    assert info.value.trigger_id == 7


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda token: token[:-5] + "AAAAA",
        lambda token: token[:20],
        lambda token: "not base64 !!!",
        lambda token: "é" + token,
        lambda token: "",
    ],
)
def test_corrupted_token_raises_decryption_error(corrupt) -> None:
    cipher = KwargsCipher(new_key())
    token = cipher.encrypt_kwargs(KWARGS, owner="T")
    with pytest.raises(DecryptionError, match="corrupted") as info:
        cipher.decrypt_kwargs(corrupt(token), trigger_id=5)
    assert info.value.trigger_id == 5


def test_token_with_bad_json_inside_raises_decryption_error() -> None:
    cipher = KwargsCipher(new_key())
    for plaintext in ("{not json", "[1, 2]"):
        with pytest.raises(DecryptionError, match="trigger 9") as info:
            cipher.decrypt_kwargs(cipher.encrypt(plaintext), trigger_id=9)
        assert info.value.trigger_id == 9
        assert isinstance(info.value.__cause__, SerializationError)


def test_repr_does_not_show_keys() -> None:
    first, second = new_key(), new_key()
    text = repr(KwargsCipher(f"{first},{second}"))
    assert first not in text
    assert second not in text
    assert "keys=2" in text


def test_generated_key_file_is_private_and_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    caplog.set_level(logging.WARNING, logger="engine.crypto")
    old_umask = os.umask(0)  # the mode must not depend on the process umask
    try:
        key = load_or_create_fernet_key("", home)
    finally:
        os.umask(old_umask)
    key_file = home / FERNET_KEY_FILENAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert key_file.read_text().strip() == key
    assert [p.name for p in home.iterdir()] == [FERNET_KEY_FILENAME]  # no temp file left
    Fernet(key)  # a valid key

    generated = [r for r in caplog.records if r.__dict__.get("action") == "fernet_key_generated"]
    assert len(generated) == 1
    assert generated[0].levelno == logging.WARNING
    assert str(key_file) in generated[0].getMessage()
    assert all(key not in r.getMessage() and key not in str(r.__dict__) for r in caplog.records)

    caplog.clear()
    assert load_or_create_fernet_key("", home) == key
    assert KwargsCipher.from_config("", home).decrypt(KwargsCipher(key).encrypt("x")) == "x"
    assert not caplog.records


def test_configured_key_wins_over_the_file(tmp_path: Path) -> None:
    configured = f"{new_key()},{new_key()}"
    assert load_or_create_fernet_key(f" {configured} ", tmp_path) == configured
    assert not (tmp_path / FERNET_KEY_FILENAME).exists()


# Fixed ids: a random key in a test id differs between two collections (pytest-xdist's
# workers must collect the same tests).
@pytest.mark.parametrize(
    "configured",
    [
        pytest.param("not-a-key", id="not-a-key"),
        pytest.param(f"{Fernet.generate_key().decode()},short", id="a-key-then-short"),
    ],
)
def test_invalid_configured_key_names_the_config_key(configured: str, tmp_path: Path) -> None:
    with pytest.raises(EncryptionError) as info:
        load_or_create_fernet_key(configured, tmp_path)
    message = str(info.value)
    assert "[core] fernet_key" in message
    assert "Fernet.generate_key().decode()" in message
    assert "short" not in message
    assert "not-a-key" not in message
    with pytest.raises(EncryptionError, match=r"\[core\] fernet_key"):
        KwargsCipher(configured)


def test_invalid_key_file_names_the_file(tmp_path: Path) -> None:
    key_file = tmp_path / FERNET_KEY_FILENAME
    key_file.write_text("garbage\n")
    key_file.chmod(0o600)
    with pytest.raises(EncryptionError, match="key file") as info:
        load_or_create_fernet_key("", tmp_path)
    assert str(key_file) in str(info.value)


def test_key_file_readable_by_others_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = new_key()
    key_file = tmp_path / FERNET_KEY_FILENAME
    key_file.write_text(key)
    key_file.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="engine.crypto"):
        assert load_or_create_fernet_key("", tmp_path) == key
    assert [r.__dict__.get("action") for r in caplog.records] == ["fernet_key_file_too_open"]


def test_a_key_file_created_concurrently_is_never_replaced(tmp_path: Path) -> None:
    # Two processes generating at once: the second must adopt the first one's key.
    winner = new_key()
    key_file = tmp_path / FERNET_KEY_FILENAME
    key_file.write_text(winner)
    assert crypto._write_new_key_file(key_file, new_key()) is False
    assert key_file.read_text() == winner
    assert [p.name for p in tmp_path.iterdir()] == [FERNET_KEY_FILENAME]
