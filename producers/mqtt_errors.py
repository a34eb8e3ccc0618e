"""Where paho's reason codes and the socket's errors become ``producers.exceptions`` ones.

The one place that reads paho's reason codes: a refused CONNACK, a failed SUBACK or PUBACK,
an unexpected DISCONNECT. Credentials never show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)

if TYPE_CHECKING:
    from producers.mqtt_core import MqttSettings

# CONNACK reason codes (MQTT 5; paho maps 3.1.1's return codes onto them).
_REFUSED_LOGIN: Final = frozenset({134, 135, 138, 140})  # bad login, not authorized, banned
_UNAVAILABLE: Final = frozenset({136, 137, 159})  # server unavailable, busy, rate exceeded
SESSION_TAKEN_OVER: Final = 142


def _describe(reason: Any) -> str:
    name = getattr(reason, "getName", None)
    value = getattr(reason, "value", reason)
    return f"{name()} ({value})" if name is not None else str(value)


def connect_refused(settings: MqttSettings, reason: Any) -> ProducerError:
    """The error for a CONNACK that refused the connection."""
    value = int(getattr(reason, "value", 128))
    where = f"MQTT broker {settings.address} refused client {settings.client_id!r}"
    detail = f"{where}: {_describe(reason)}"
    if value in _REFUSED_LOGIN:
        return BrokerRefused(
            f"{detail}. Check the trigger's username / password (or its connection)",
            address=settings.address,
        )
    if value in _UNAVAILABLE:
        return BrokerUnavailable(
            f"{detail}; the watchers restart with backoff", address=settings.address
        )
    return ProducerConfigError(
        f"{detail}. Check the trigger's protocol ({settings.protocol}) and client_id"
    )


def connect_failed(settings: MqttSettings, exc: BaseException) -> BrokerUnavailable:
    """The error for a TCP connection (or CONNECT) that failed or timed out."""
    return BrokerUnavailable(
        f"cannot reach the MQTT broker at {settings.address} ({exc!r}); the watchers "
        "restart with backoff. Check the trigger's host / port and that the broker runs",
        address=settings.address,
    )


def connection_lost(settings: MqttSettings, reason: Any) -> ProducerError:
    """The error for a connection that ended while the stream was open."""
    if int(getattr(reason, "value", 0)) == SESSION_TAKEN_OVER:
        return BrokerRequestFailed(
            f"MQTT broker {settings.address}: another client connected with client_id "
            f"{settings.client_id!r} and took the session over; give each subscription its "
            "own client_id (un-acked messages stay in the session)"
        )
    return BrokerUnavailable(
        f"the MQTT broker at {settings.address} closed the connection of client "
        f"{settings.client_id!r} ({_describe(reason)}); the watchers restart with backoff "
        "and the persistent session redelivers what was not acked",
        address=settings.address,
    )


def subscribe_refused(settings: MqttSettings, topic: str, reason: Any) -> ProducerError:
    """The error for a SUBACK that refused (or downgraded) a topic filter."""
    return ProducerConfigError(
        f"MQTT broker {settings.address} refused the QoS 1 subscription of client "
        f"{settings.client_id!r} to {topic!r}: {_describe(reason)}. Check the topic filter "
        "and the broker's ACL / max_qos"
    )


def publish_refused(settings: MqttSettings, topic: str, reason: Any) -> ProducerError:
    """The error for a dead-letter PUBLISH the broker refused (MQTT 5 PUBACK)."""
    return BrokerRequestFailed(
        f"MQTT broker {settings.address} refused the dead-letter publish to {topic!r}: "
        f"{_describe(reason)}; the message is not acked and is redelivered"
    )


def not_connected(settings: MqttSettings, action: str, code: Any) -> BrokerUnavailable:
    """The error for a client call made when the connection was already gone."""
    return BrokerUnavailable(
        f"MQTT {action} on {settings.address} failed ({code!r}): the connection is gone; "
        "the persistent session redelivers what was not acked",
        address=settings.address,
    )
