"""Fernet encryption of trigger kwargs and other secrets stored in the metadata DB.

``[core] fernet_key`` holds one key or a comma-separated list: the first key encrypts, every
key decrypts (``MultiFernet``), so a key is rotated by putting the new key first, running
``sluice db rotate-fernet-key``, then dropping the old key. With no key configured, a key is
generated once into ``<home>/fernet.key`` (mode 0600) and reused afterwards.
"""

from __future__ import annotations

import binascii
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from engine.exceptions import DecryptionError, EncryptionError
from triggers.exceptions import SerializationError
from triggers.serde import dumps_kwargs, loads_kwargs

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)

FERNET_KEY_FILENAME: Final = "fernet.key"
FERNET_KEY_CONFIG: Final = "[core] fernet_key"
KEY_FILE_MODE: Final = 0o600
HOME_DIR_MODE: Final = 0o700
GENERATE_KEY_COMMAND: Final = (
    'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
)
WRONG_KEY_HINT: Final = (
    f"the row was encrypted with a key that is not in {FERNET_KEY_CONFIG}; add the old key "
    "after the new one (comma-separated) or run `sluice db rotate-fernet-key`"
)


def _parse_keys(keys: str, *, source: str) -> list[Fernet]:
    """One ``Fernet`` per comma-separated key; errors name ``source``, never the key."""
    parts = [part.strip() for part in keys.split(",") if part.strip()]
    if not parts:
        raise EncryptionError(
            f"{source} holds no Fernet key; generate one with: {GENERATE_KEY_COMMAND}"
        )
    fernets: list[Fernet] = []
    for position, part in enumerate(parts, start=1):
        try:
            fernets.append(Fernet(part))
        except (ValueError, binascii.Error) as exc:
            raise EncryptionError(
                f"key #{position} of {source} is not a valid Fernet key (32 url-safe "
                f"base64-encoded bytes); generate one with: {GENERATE_KEY_COMMAND}"
            ) from exc
    return fernets


def _read_key_file(path: Path) -> str:
    source = f"key file {path}"
    try:
        text = path.read_text(encoding="ascii").strip()
        mode = stat.S_IMODE(path.stat().st_mode)
    except (OSError, UnicodeDecodeError) as exc:
        raise EncryptionError(f"cannot read the Fernet {source}: {exc}") from exc
    _parse_keys(text, source=source)
    if mode & 0o077:
        logger.warning(
            "Fernet key file %s is readable by other users (mode %o); run: chmod 600 %s",
            path,
            mode,
            path,
            extra={"action": "fernet_key_file_too_open", "path": str(path)},
        )
    return text


def _write_new_key_file(path: Path, key: str) -> bool:
    """Write ``key`` to ``path`` atomically; False when another process created it first."""
    path.parent.mkdir(mode=HOME_DIR_MODE, parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{FERNET_KEY_FILENAME}.", dir=path.parent)
    try:
        os.fchmod(fd, KEY_FILE_MODE)
        with os.fdopen(fd, "w", encoding="ascii") as tmp:
            tmp.write(key + "\n")
            tmp.flush()
            os.fsync(tmp.fileno())
        return _publish(Path(tmp_name), path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)


def _publish(tmp: Path, path: Path) -> bool:
    # A hard link never replaces a key another process published meanwhile (two processes
    # with two different keys could not read each other's rows); os.replace is the fallback
    # on file systems without hard links.
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:
        os.replace(tmp, path)
    return True


def load_or_create_fernet_key(configured: str, home: Path) -> str:
    """The configured key list, else the key in ``home/fernet.key``, else a new one saved there."""
    if configured.strip():
        _parse_keys(configured, source=FERNET_KEY_CONFIG)
        return configured.strip()
    path = home / FERNET_KEY_FILENAME
    if path.exists():
        return _read_key_file(path)
    key = Fernet.generate_key().decode("ascii")
    try:
        created = _write_new_key_file(path, key)
    except OSError as exc:
        raise EncryptionError(
            f"cannot write a new Fernet key to {path}: {exc}; set {FERNET_KEY_CONFIG} "
            f"instead (generate one with: {GENERATE_KEY_COMMAND})"
        ) from exc
    if not created:
        return _read_key_file(path)
    logger.warning(
        "%s is not set: generated a new Fernet key in %s. Back this file up: trigger kwargs "
        "encrypted with it cannot be read without it",
        FERNET_KEY_CONFIG,
        path,
        extra={"action": "fernet_key_generated", "path": str(path)},
    )
    return key


def _subject(trigger_id: int | None) -> str:
    return "a stored value" if trigger_id is None else f"the kwargs of trigger {trigger_id}"


def _undecryptable(verb: str, trigger_id: int | None) -> DecryptionError:
    return DecryptionError(
        f"cannot {verb} {_subject(trigger_id)}: the token is corrupted or {WRONG_KEY_HINT}",
        trigger_id=trigger_id,
    )


class KwargsCipher:
    """Encrypts with the first configured Fernet key, decrypts with any of them."""

    __slots__ = ("_fernet", "_key_count")

    def __init__(self, keys: str) -> None:
        fernets = _parse_keys(keys, source=FERNET_KEY_CONFIG)
        self._fernet = MultiFernet(fernets)
        self._key_count = len(fernets)

    @classmethod
    def from_config(cls, configured: str, home: Path) -> KwargsCipher:
        """Build from ``[core] fernet_key`` (or the generated key file under ``home``)."""
        return cls(load_or_create_fernet_key(configured, home))

    def __repr__(self) -> str:
        return f"<KwargsCipher keys={self._key_count}>"

    def encrypt(self, data: str) -> str:
        """Encrypt text with the first key; the token is ASCII."""
        return self._fernet.encrypt(data.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str, *, trigger_id: int | None = None) -> str:
        """Decrypt a token made by ``encrypt`` with any configured key."""
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise _undecryptable("decrypt", trigger_id) from exc

    def rotate(self, token: str, *, trigger_id: int | None = None) -> str:
        """Re-encrypt ``token`` with the first key (for ``sluice db rotate-fernet-key``)."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, UnicodeError) as exc:
            raise _undecryptable("rotate", trigger_id) from exc

    def encrypt_kwargs(self, kwargs: Mapping[str, object], *, owner: str) -> str:
        """Serialize (tagged JSON) then encrypt a trigger's kwargs; ``owner`` is its classpath."""
        return self.encrypt(dumps_kwargs(kwargs, owner=owner))

    def decrypt_kwargs(self, token: str, *, trigger_id: int | None = None) -> dict[str, object]:
        """Decrypt then deserialize kwargs made by ``encrypt_kwargs``."""
        text = self.decrypt(token, trigger_id=trigger_id)
        try:
            return loads_kwargs(text)
        except SerializationError as exc:
            raise DecryptionError(
                f"cannot read {_subject(trigger_id)}: the token decrypted but does not hold "
                f"valid stored kwargs ({exc}); the row was altered or written by another "
                "program",
                trigger_id=trigger_id,
            ) from exc
