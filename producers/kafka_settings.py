"""Kafka shared-stream settings: defaults, validation, and the dead-letter headers.

See ``producers.kafka`` for what ``on_unclean`` does; this module only checks settings and
builds texts, without I/O.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from producers.exceptions import ProducerConfigError, UncleanEventError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from producers.kafka_client import KafkaMessage
    from shared_stream.producer import AdvanceItem

OnUnclean = Literal["commit", "dead_letter", "stop"]
ON_UNCLEAN_CHOICES: Final = ("commit", "dead_letter", "stop")
OFFSET_RESETS: Final = ("earliest", "latest", "none")
DEFAULT_AUTO_OFFSET_RESET: Final = "latest"
DEFAULT_SESSION_TIMEOUT_MS: Final = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 3_000
DEFAULT_REBALANCE_TIMEOUT_MS: Final = 20_000
DEFAULT_MAX_POLL_RECORDS: Final = 1_000
# Messages yielded and not advanced yet, above which the consumer fetches no more until
# advances catch up: the pipeline behind it (subscriber queues, outbox, the writer) holds a
# bounded backlog, not the whole topic (every message held is ~15 Python objects, and the
# garbage collector's full passes grow with them: unbounded, they took half the CPU).
DEFAULT_MAX_INFLIGHT_MESSAGES: Final = 8_000
# Messages per raw event of a batch-mode consumer (``producers.kafka``): at most this many
# consecutive records of one partition from one fetch are fanned out, resolved and advanced
# as one ``KafkaMessageBatch``.
DEFAULT_BATCH_MESSAGES: Final = 250
# aiokafka leaves the group when no records were fetched for this long (its default is 300 s,
# the shared-stream ack timeout's default too): a consumer held at ``max_inflight_messages``
# while the store is slow does not fetch, and must not give its partitions up for that
# (a stuck event loop still leaves, by the session timeout). ``consumer_options`` may set it.
DEFAULT_MAX_POLL_INTERVAL_MS: Final = 3_600_000
# How long the broker may hold a fetch that finds no new records (aiokafka's default is 500
# ms). aiokafka keeps one fetch in flight per broker and leaves out the partitions it still
# holds records of: when a backlogged partition's records run out while that fetch waits on
# the consumer's idle (caught-up) partitions, the backlog waits for the fetch to time out.
# Measured (bench/kafka_bench.py): the last records of a partition came 350 ms after the
# others, 12% of a 100k-message run. 100 ms bounds the stall; an idle consumer then sends
# ten fetches a second instead of two. ``consumer_options`` may set it.
DEFAULT_FETCH_MAX_WAIT_MS: Final = 100
DEFAULT_ADVANCE_TIMEOUT_S: Final = 30.0
FETCH_WAIT_MS: Final = 500
DEAD_LETTER_HEADER: Final = "sluice.dead_letter."
DEAD_LETTER_ERRORS_MAX_CHARS: Final = 4_000
# Consumer options the producer sets itself (``consumer_options`` may not override them).
_MANAGED_OPTIONS: Final = frozenset(
    {
        "bootstrap_servers",
        "client_id",
        "group_id",
        "auto_offset_reset",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "rebalance_timeout_ms",
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "ssl_context",
        "key_deserializer",
        "value_deserializer",
    }
)


def check_group(
    group_id: str, topics: Sequence[str], dead_letter_topic: str | None, auto_offset_reset: str
) -> None:
    """Refuse a group that cannot work: no group id or topics, a looping dead-letter topic."""
    if not group_id:
        raise ProducerConfigError("a Kafka shared stream needs a group_id (commits are per group)")
    if not topics:
        raise ProducerConfigError(f"Kafka group {group_id!r}: give at least one topic")
    if dead_letter_topic is not None and dead_letter_topic in topics:
        raise ProducerConfigError(
            f"dead_letter_topic {dead_letter_topic!r} is also a consumed topic; "
            "dead-lettered messages would come back: choose another topic"
        )
    if auto_offset_reset not in OFFSET_RESETS:
        raise ProducerConfigError(
            f"auto_offset_reset must be one of {list(OFFSET_RESETS)}, got {auto_offset_reset!r}"
        )


def resolve_on_unclean(on_unclean: str | None, dead_letter_topic: str | None) -> OnUnclean:
    """The effective policy: explicit, else dead_letter with a topic, else stop."""
    if on_unclean is None:
        return "dead_letter" if dead_letter_topic else "stop"
    if on_unclean not in ON_UNCLEAN_CHOICES:
        raise ProducerConfigError(
            f"on_unclean must be one of {list(ON_UNCLEAN_CHOICES)}, got {on_unclean!r}"
        )
    if on_unclean == "dead_letter" and not dead_letter_topic:
        raise ProducerConfigError(
            'on_unclean="dead_letter" needs dead_letter_topic; set one, or choose "stop" '
            '(redeliver) or "commit" (skip the message) explicitly'
        )
    return cast("OnUnclean", on_unclean)


def check_consumer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Extra aiokafka consumer options; refuses auto-commit and options the producer owns."""
    if options.get("enable_auto_commit"):
        raise ProducerConfigError(
            "enable_auto_commit=True is refused: the shared-stream ack channel must own what "
            "the broker considers delivered (offsets are committed only once every watcher "
            "processed a message); remove it from consumer_options"
        )
    clashing = sorted(set(options) & _MANAGED_OPTIONS)
    if clashing:
        raise ProducerConfigError(
            f"consumer_options may not set {clashing}: pass them as the trigger's own keyword "
            "arguments"
        )
    return {**options, "enable_auto_commit": False}


def outcome_text(item: AdvanceItem) -> str:
    o = item.outcome
    return f"acked={o.acked} failed={o.failed} rejected={o.rejected}"


def _reason(item: AdvanceItem) -> str:
    if item.outcome.rejected:
        return "rejected"
    return "failed" if item.outcome.failed else "no_subscribers"


def dead_letter_headers(
    item: AdvanceItem, message: KafkaMessage, group_id: str
) -> list[tuple[str, bytes]]:
    """The ``sluice.dead_letter.*`` headers added to a dead-lettered copy of ``message``."""
    rejected_by = ",".join(str(r.trigger_id) for r in message.rejections)
    errors = json.dumps(
        [{"trigger_id": r.trigger_id, "reason": r.reason} for r in message.rejections]
    )
    if len(errors) > DEAD_LETTER_ERRORS_MAX_CHARS:
        errors = errors[: DEAD_LETTER_ERRORS_MAX_CHARS - 3] + "..."
    pairs = {
        "reason": _reason(item),
        "outcome": outcome_text(item),
        "source": message.coordinates,
        "group": group_id,
        "rejected_by": rejected_by,
        "errors": errors,
    }
    return [(DEAD_LETTER_HEADER + name, text.encode()) for name, text in pairs.items()]


def unclean_stop_error(entry: tuple[AdvanceItem, KafkaMessage], where: str) -> UncleanEventError:
    item, message = entry
    reasons = "; ".join(f"trigger {r.trigger_id}: {r.reason}" for r in message.rejections)
    return UncleanEventError(
        f"Kafka message {message.coordinates} ({where}) was not cleanly delivered "
        f"({outcome_text(item)}{'; ' + reasons if reasons else ''}) and on_unclean='stop': the "
        f"shared stream stops and the broker redelivers from offset {message.offset}. Set "
        "dead_letter_topic, or on_unclean='commit' to skip such messages"
    )


# --- a connection (``kafka_config_id``) as trigger kwargs --------------------------------

#: Keys of a Kafka connection's extra (librdkafka's names, as Airflow's Kafka provider
#: stores them, or the trigger's own) -> the trigger kwarg they set.
CONNECTION_EXTRA_KEYS: Final = {
    "bootstrap.servers": "bootstrap_servers",
    "bootstrap_servers": "bootstrap_servers",
    "client.id": "client_id",
    "client_id": "client_id",
    "security.protocol": "security_protocol",
    "security_protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl_mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl_plain_username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl_plain_password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl_cafile": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl_certfile": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl_password": "ssl_password",
}


def settings_from_connection(connection: Mapping[str, Any]) -> dict[str, Any]:
    """``KafkaMessageTrigger`` kwargs from a connection: its extra's client settings
    (``CONNECTION_EXTRA_KEYS``), else ``host[:port]`` as the bootstrap servers and
    ``login`` / ``password`` as the SASL user. Only what the connection defines is set;
    ``ValueError`` when it names no bootstrap server."""
    extra = connection.get("extra") or {}
    settings: dict[str, Any] = {}
    if connection.get("login"):
        settings["sasl_plain_username"] = connection["login"]
    if connection.get("password"):
        settings["sasl_plain_password"] = connection["password"]
    host, port = connection.get("host"), connection.get("port")
    if host:
        settings["bootstrap_servers"] = f"{host}:{port}" if port else host
    for key, value in extra.items():
        name = CONNECTION_EXTRA_KEYS.get(key)
        if name is not None and value not in (None, ""):
            settings[name] = value
    if not settings.get("bootstrap_servers"):
        raise ValueError(
            f"Kafka connection {connection.get('conn_id')!r} names no bootstrap server: set "
            "its host (and port) or 'bootstrap.servers' in its extra"
        )
    return settings
