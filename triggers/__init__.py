"""Triggers: the trigger contract and the built-in triggers.

A trigger waits for something outside (a moment, a file, a message) and yields
``TriggerEvent``s; see ``triggers.base`` for the contract. Test doubles live in
``triggers.testing`` and the storage format in ``triggers.serde``.
"""

from __future__ import annotations

from triggers.base import (
    BaseEventTrigger,
    BaseTaskEndEvent,
    BaseTrigger,
    StartTriggerArgs,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
    classpath_of,
)
from triggers.exceptions import (
    SerializationError,
    TriggerContractError,
    TriggerError,
    UpstreamRefused,
    UpstreamUnavailable,
)
from triggers.file import DirectoryFileDeleteTrigger, FileDeleteTrigger, FileTrigger
from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger
from triggers.watch import DirectoryWatchTrigger

__all__: tuple[str, ...] = (
    "BaseEventTrigger",
    "BaseTaskEndEvent",
    "BaseTrigger",
    "DateTimeTrigger",
    "DirectoryFileDeleteTrigger",
    "DirectoryWatchTrigger",
    "FileDeleteTrigger",
    "FileTrigger",
    "SerializationError",
    "StartTriggerArgs",
    "TaskFailedEvent",
    "TaskSkippedEvent",
    "TaskSuccessEvent",
    "TimeDeltaTrigger",
    "TriggerContractError",
    "TriggerError",
    "TriggerEvent",
    "UpstreamRefused",
    "UpstreamUnavailable",
    "classpath_of",
)
