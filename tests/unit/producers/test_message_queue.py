"""``MessageQueueTrigger``, Airflow's common-messaging constructor: each scheme Sluice reads
(``scheme=`` or a ``queue=`` URI) gives the Sluice watcher trigger with Airflow's arguments
translated; an unknown scheme, an argument without a Sluice meaning, or a triggerer queue
is a clear error."""

from __future__ import annotations

from typing import Any

import pytest

from producers import (
    KafkaMessageTrigger,
    MessageQueueTrigger,
    MqttMessageTrigger,
    NatsJetStreamTrigger,
    RabbitMQMessageTrigger,
    RedisStreamTrigger,
    SqsMessageTrigger,
)
from producers.exceptions import ProducerConfigError

SQS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def test_scheme_kafka_builds_a_kafka_watcher_with_airflows_arguments() -> None:
    trigger = MessageQueueTrigger(
        scheme="kafka",
        topics=["orders", "refunds"],
        group_id="sluice-orders",
        bootstrap_servers="broker:9092",
        apply_function="my_dags.filters.accept",
        apply_function_kwargs={"region": "eu"},
    )
    assert isinstance(trigger, KafkaMessageTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "producers.kafka_trigger.KafkaMessageTrigger"
    assert kwargs["topics"] == ["orders", "refunds"]
    assert kwargs["apply_function"] == "my_dags.filters.accept"
    assert kwargs["apply_function_kwargs"] == {"region": "eu"}
    assert trigger.settings.bootstrap_servers == ("broker:9092",)


def test_a_kafka_queue_uri_gives_brokers_and_topics() -> None:
    trigger = MessageQueueTrigger(queue="kafka://broker-a:9092/orders,refunds", group_id="g")
    assert isinstance(trigger, KafkaMessageTrigger)
    assert (trigger.topics, trigger.settings.bootstrap_servers) == (
        ("orders", "refunds"),
        ("broker-a:9092",),
    )
    named = MessageQueueTrigger(queue="kafka://broker-a:9092/", topics=["x"], group_id="g")
    assert named.topics == ("x",)


def test_scheme_sqs_builds_an_sqs_watcher_with_airflows_names() -> None:
    trigger = MessageQueueTrigger(
        scheme="sqs",
        sqs_queue=SQS_URL,
        aws_conn_id="aws_default",
        wait_time_seconds=5,
        visibility_timeout=60,
        delete_message_on_reception=True,
    )
    assert isinstance(trigger, SqsMessageTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "producers.sqs_trigger.SqsMessageTrigger"
    assert (kwargs["queue_url"], kwargs["aws_conn_id"]) == (SQS_URL, "aws_default")
    assert (kwargs["wait_time_s"], kwargs["visibility_timeout_s"]) == (5, 60)


def test_an_sqs_queue_url_builds_an_sqs_watcher() -> None:
    trigger = MessageQueueTrigger(queue=SQS_URL, region_name="eu-west-1")
    assert isinstance(trigger, SqsMessageTrigger)
    assert trigger.serialize()[1]["queue_url"] == SQS_URL


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"scheme": "rabbitmq", "queue": "orders", "url": AMQP}, RabbitMQMessageTrigger),
        ({"scheme": "amqp", "queue": "orders", "url": AMQP}, RabbitMQMessageTrigger),
        ({"scheme": "redis+streams", "stream": "orders", "group": "g"}, RedisStreamTrigger),
        ({"scheme": "mqtt", "topic": "sensors/#", "client_id": "c"}, MqttMessageTrigger),
        ({"scheme": "nats", "stream": "ORDERS", "durable": "sluice"}, NatsJetStreamTrigger),
    ],
)
def test_the_other_brokers_take_their_own_arguments_by_scheme(
    arguments: dict[str, Any], expected: type
) -> None:
    trigger = MessageQueueTrigger(**arguments)
    assert type(trigger) is expected
    direct = expected(**{k: v for k, v in arguments.items() if k != "scheme"})
    assert trigger.serialize() == direct.serialize()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"scheme": "redis+pubsub", "channels": ["c"]}, "cannot redeliver.*redis\\+streams"),
        ({"scheme": "zeromq"}, r"known schemes are \['kafka', 'sqs', 'rabbitmq'"),
        ({"queue": "amqp://rabbit/q"}, "give scheme="),
        ({"scheme": "rabbitmq", "queue": "q", "url": AMQP, "colour": "blue"}, r"takes no"),
        ({}, "give scheme="),
        ({"queue": "kafka://broker:9092", "group_id": "g"}, "names no topic"),
        ({"scheme": "kafka", "topics": ["t"]}, "give group_id="),
        ({"scheme": "kafka", "topics": ["t"], "group_id": "g", "poll_timeout": 1}, "poll_timeout"),
        ({"scheme": "sqs", "sqs_queue": SQS_URL, "max_messages": 5}, "max_in_flight"),
        ({"scheme": "sqs", "sqs_queue": SQS_URL, "message_filtering": "jsonpath"}, "body_filter"),
        (
            {"scheme": "sqs", "sqs_queue": SQS_URL, "delete_message_on_reception": False},
            "ack mode",
        ),
        ({"scheme": "sqs", "sqs_queue": SQS_URL, "colour": "blue"}, r"takes no \['colour'\]"),
        ({"scheme": "kafka", "trigger_queue": "fast"}, "no triggerer queues"),
    ],
)
def test_what_sluice_cannot_honour_is_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ProducerConfigError, match=message):
        MessageQueueTrigger(**arguments)
