"""Where aiokafka's exceptions become ``producers.exceptions`` ones (the cause kept).

``translate_kafka_error`` is the one place that reads aiokafka's error classes; the producer
raises what it returns ``from`` the original.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from aiokafka import errors as kafka_errors

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)
from producers.kafka_bootstrap import describe

if TYPE_CHECKING:
    from collections.abc import Sequence

    from producers.kafka_bootstrap import BootstrapFailure

logger = logging.getLogger(__name__)

_CONFIG_ERRORS: Final = (
    kafka_errors.AuthenticationFailedError,
    kafka_errors.AuthenticationMethodNotSupported,
    kafka_errors.KafkaConfigurationError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.InvalidGroupIdError,
    kafka_errors.InvalidSessionTimeoutError,
    kafka_errors.InvalidTopicError,
    kafka_errors.IncompatibleBrokerVersion,
    kafka_errors.UnsupportedCodecError,
    kafka_errors.IllegalArgumentError,
)
_UNAVAILABLE_ERRORS: Final = (
    kafka_errors.KafkaTimeoutError,
    kafka_errors.KafkaUnavailableError,
    kafka_errors.BrokerNotAvailableError,
)


def translate_kafka_error(
    exc: BaseException,
    *,
    doing: str,
    where: str,
    address: str | None = None,
    bootstrap: Sequence[BootstrapFailure] = (),
) -> ProducerError:
    """The ``producers.exceptions`` error for an aiokafka failure (raise it ``from exc``);
    ``address`` (the bootstrap servers) goes on a ``BrokerUnavailable`` / ``BrokerRefused``.

    ``bootstrap`` are the per-server failures aiokafka logged while bootstrapping
    (``producers.kafka_bootstrap``): they say why, and a refused login or TLS handshake
    among them makes the error a ``BrokerRefused`` (retrying will not help), not an
    unreachable broker.
    """
    detail = f"{type(exc).__name__}: {exc}"
    if bootstrap and isinstance(exc, kafka_errors.KafkaConnectionError):
        refusals = [failure for failure in bootstrap if failure.is_refusal]
        if refusals:
            return BrokerRefused(
                f"Kafka at {address or where} refused {doing}: {describe(refusals)}; check "
                "security_protocol, the sasl_* and ssl_* settings and the broker's listeners",
                address=address,
            )
        detail = f"{describe(bootstrap)} ({detail})"
    if isinstance(exc, kafka_errors.UnknownTopicOrPartitionError):
        return ProducerConfigError(
            f"Kafka does not know a topic or partition {doing} at {where}: {detail}; check "
            "the topic names (misspelled? not created yet?)"
        )
    if isinstance(exc, _CONFIG_ERRORS):
        return ProducerConfigError(
            f"Kafka refused {doing} at {where}: {detail}; check the connection, security and "
            "group settings and the broker's ACLs"
        )
    if isinstance(exc, _UNAVAILABLE_ERRORS) or getattr(exc, "retriable", False):
        return BrokerUnavailable(
            f"the Kafka broker is unreachable while {doing} at {where}: {detail}; check "
            "bootstrap_servers and that the broker is up (the watchers restart with backoff)",
            address=address,
        )
    return BrokerRequestFailed(f"Kafka failed {doing} at {where}: {detail}")


async def stop_client(client: Any, *, where: str, group_id: str | None) -> None:
    """``await client.stop()`` of an aiokafka consumer or producer; a failure is a warning.

    aiokafka's ``stop()`` awaits its own background tasks, and one it cancelled itself (a
    coordinator that lost its broker) re-raises ``CancelledError`` into the caller, who was
    not cancelled: that stray one is a failed stop too (warned, the next client still
    stopped), not the caller's cancellation; a real one (``cancelling()``) propagates.
    """
    try:
        await client.stop()
    except kafka_errors.KafkaError as exc:
        error: BaseException = exc
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        error = exc
    else:
        return
    logger.warning(
        "Stopping a Kafka client of %s failed: %r",
        where,
        error,
        extra={"action": "kafka.close_failed", "group_id": group_id},
    )
