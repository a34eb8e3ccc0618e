"""Triggers: the trigger contract and the built-in triggers.

A trigger waits for something outside (a moment, a file, a message) and yields
``TriggerEvent``s; see ``triggers.base`` for the contract. Test doubles live in
``triggers.testing``, the storage format in ``triggers.serde``, which extra of the ``sluice``
distribution installs which client in ``triggers.extras``, and what the lazily loading
packages share in ``triggers.lazy``. Imports nothing of ``shared_stream``, ``producers`` or
``engine`` (but the type of ``create_shared_stream_producer``); every other package imports it.

The names below load on first use (PEP 562 ``__getattr__``): ``import triggers.base`` (what
every task step and DAG file parse needs) does not pay for anyio, asyncio and watchfiles,
which only the triggers that run in the triggerer import. ``from triggers import X`` and
``triggers.X`` work as before; type checkers read the imports under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from triggers.lazy import load_on_first_use

if TYPE_CHECKING:
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
        MissingExtraError,
        SerializationError,
        TriggerContractError,
        TriggerError,
        UpstreamRefused,
        UpstreamUnavailable,
    )
    from triggers.file import DirectoryFileDeleteTrigger, FileDeleteTrigger, FileTrigger
    from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger
    from triggers.watch import DirectoryWatchTrigger

#: public name -> the module that defines it
_MODULE_OF: Final[dict[str, str]] = {
    "BaseEventTrigger": "triggers.base",
    "BaseTaskEndEvent": "triggers.base",
    "BaseTrigger": "triggers.base",
    "DateTimeTrigger": "triggers.temporal",
    "DirectoryFileDeleteTrigger": "triggers.file",
    "DirectoryWatchTrigger": "triggers.watch",
    "FileDeleteTrigger": "triggers.file",
    "FileTrigger": "triggers.file",
    "MissingExtraError": "triggers.exceptions",
    "SerializationError": "triggers.exceptions",
    "StartTriggerArgs": "triggers.base",
    "TaskFailedEvent": "triggers.base",
    "TaskSkippedEvent": "triggers.base",
    "TaskSuccessEvent": "triggers.base",
    "TimeDeltaTrigger": "triggers.temporal",
    "TriggerContractError": "triggers.exceptions",
    "TriggerError": "triggers.exceptions",
    "TriggerEvent": "triggers.base",
    "UpstreamRefused": "triggers.exceptions",
    "UpstreamUnavailable": "triggers.exceptions",
    "classpath_of": "triggers.base",
}

__all__: tuple[str, ...] = (
    "BaseEventTrigger",
    "BaseTaskEndEvent",
    "BaseTrigger",
    "DateTimeTrigger",
    "DirectoryFileDeleteTrigger",
    "DirectoryWatchTrigger",
    "FileDeleteTrigger",
    "FileTrigger",
    "MissingExtraError",
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


if not TYPE_CHECKING:  # type checkers read the imports above: a misspelt name is an error
    __getattr__, __dir__ = load_on_first_use(__name__, _MODULE_OF)
