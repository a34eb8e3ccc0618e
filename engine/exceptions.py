"""Exceptions of the engine: one root, ``SluiceError``, subclasses by how the caller reacts."""

from __future__ import annotations


class SluiceError(Exception):
    """Root of every error the engine raises on purpose."""


class LeaseLost(SluiceError):
    """A part no longer owns (or cannot prove it owns) what its job row held: another
    process may have taken it over. Raised by ``engine.db`` when a write guarded by the
    owner's job row finds that row no longer running; nothing was written."""


class ConfigError(SluiceError):
    """The configuration is wrong: names the key and where the value came from."""


class DatabaseError(SluiceError):
    """The metadata database cannot be used (unreachable, locked, schema mismatch, a statement
    it refused). Raised by ``engine.db`` with the driver's error as ``__cause__``."""


class DatabaseUnavailable(DatabaseError):
    """The metadata database cannot be reached for now (connection refused, lost or reset,
    locked for too long): the same work may succeed once it is back, so retrying loops retry
    on this one and give up on any other ``DatabaseError``."""


class SchemaNotCurrentError(DatabaseError):
    """The metadata database schema is not at the current migration head."""


class OperatorActionError(SluiceError):
    """An operator action (clear, set a state, cancel a run) cannot be done as asked: names
    the DAG, run or task and why."""


class NotFoundError(OperatorActionError):
    """The DAG, run, task or asset an operator action names does not exist."""


class InvalidStateError(OperatorActionError):
    """The operator action does not apply to the current state (a run that already ended,
    a run that already exists for that logical date)."""


class EncryptionError(SluiceError):
    """Trigger kwargs cannot be encrypted or decrypted."""


class DecryptionError(EncryptionError):
    """A stored value cannot be decrypted with any configured Fernet key."""

    def __init__(self, message: str, *, trigger_id: int | None = None) -> None:
        super().__init__(message)
        self.trigger_id = trigger_id


class TriggerLoadError(SluiceError):
    """A stored trigger cannot be turned back into an instance."""


class TriggerClassNotAllowedError(TriggerLoadError):
    """The classpath is outside ``[triggerer] allowed_trigger_modules``; it was not imported."""


class DagFileError(SluiceError):
    """A DAG file is broken; names the file and, where known, the line."""


# --- the names ported DAG files import (``airflow.sdk.exceptions.X`` -> ``engine.exceptions.X``)


class AirflowException(SluiceError):
    """Base of the exceptions a task raises or catches by Airflow's names."""


class AirflowSkipException(AirflowException):
    """Raised by a task to end as skipped instead of failed (no retry)."""


class AirflowFailException(AirflowException):
    """Raised by a task to fail at once, without using its remaining retries."""


class AirflowSensorTimeout(AirflowException):
    """A sensor did not succeed within its ``timeout``."""


class AirflowTaskTimeout(AirflowException):
    """A task ran past its ``execution_timeout``."""


class AirflowNotFoundException(AirflowException):
    """Something a task asked for (a connection, a variable, a file) does not exist."""


class ParamValidationError(AirflowException):
    """A DAG or task param does not match its ``Param`` schema; names the param and why."""
