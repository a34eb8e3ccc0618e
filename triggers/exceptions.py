"""Exceptions of the ``triggers`` package: one root, subclasses by how the caller reacts."""

from __future__ import annotations


class TriggerError(Exception):
    """Root of every error raised by the ``triggers`` package."""


class SerializationError(TriggerError, TypeError):
    """A value cannot be serialized (trigger kwargs, event payloads, next_kwargs)."""


class TriggerContractError(TriggerError):
    """A trigger broke its contract (e.g. ``run()`` returned instead of yielding)."""
