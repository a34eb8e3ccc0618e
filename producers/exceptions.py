"""Exceptions of the ``producers`` package (broker adapters translate their errors here)."""

from __future__ import annotations


class ProducerError(Exception):
    """Root of every error raised by the ``producers`` package."""


class BrokerUnavailable(ProducerError):
    """The broker cannot be reached; the caller retries with backoff."""


class ProducerConfigError(ProducerError):
    """A producer or event trigger was configured in a way that cannot work."""
