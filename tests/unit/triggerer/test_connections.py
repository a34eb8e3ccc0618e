"""Connection ids in trigger kwargs: what the triggerer builds a trigger with, and the
errors that name the watcher, the trigger and the connection."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, cast

import pytest

from engine.exceptions import TriggerLoadError
from engine.triggerer.connections import database_lookup, resolve_connections
from producers import KafkaMessageTrigger, SqsMessageTrigger
from producers.exceptions import ProducerConfigError
from producers.kafka_settings import settings_from_connection

if TYPE_CHECKING:
    from engine.crypto import KwargsCipher
    from engine.db.database import Database

WHERE = "trigger 7 of watcher 'orders'"


def _lookup(connections: dict[str, dict[str, Any]]) -> Any:
    return connections.get


def test_a_kafka_connection_fills_the_client_settings_over_the_stored_kwargs() -> None:
    trigger = KafkaMessageTrigger(topics="t", group_id="g", kafka_config_id="k")
    _, stored = trigger.serialize()
    assert stored["bootstrap_servers"] is None and stored["kafka_config_id"] == "k"
    conn = {
        "conn_type": "kafka",
        "extra": {
            "bootstrap.servers": "b1:9092,b2:9092",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "user",
            "sasl.password": "pw",
            "group.id": "ignored: the watcher's group_id is the one",
        },
    }
    kwargs = resolve_connections(KafkaMessageTrigger, stored, _lookup({"k": conn}), where=WHERE)
    assert kwargs["bootstrap_servers"] == "b1:9092,b2:9092"
    assert (kwargs["sasl_mechanism"], kwargs["sasl_plain_password"]) == ("PLAIN", "pw")
    assert kwargs["group_id"] == "g"
    built = KafkaMessageTrigger(**kwargs)
    assert built.shared_stream_key() == trigger.shared_stream_key()  # same group as parsed


def test_host_port_login_password_are_a_kafka_connection_too() -> None:
    conn = {"conn_id": "k", "host": "broker", "port": 9093, "login": "u", "password": "p"}
    assert settings_from_connection(conn) == {
        "bootstrap_servers": "broker:9093",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
    }


def test_a_kafka_trigger_needs_servers_or_a_connection() -> None:
    with pytest.raises(ProducerConfigError, match="bootstrap_servers or a kafka_config_id"):
        KafkaMessageTrigger(topics="t", group_id="g")


def test_an_aws_connection_configures_an_sqs_trigger() -> None:
    trigger = SqsMessageTrigger(queue_url="http://q/1/a", aws_conn_id="aws")
    conn = {
        "login": "AKIA",
        "password": "secret",
        "extra": {
            "region_name": "eu-west-1",
            "service_config": {"sqs": {"endpoint_url": "http://sqs.local"}},
        },
    }
    _, stored = trigger.serialize()
    kwargs = resolve_connections(SqsMessageTrigger, stored, _lookup({"aws": conn}), where=WHERE)
    built = SqsMessageTrigger(**kwargs)
    assert built.connection.client_kwargs() == {
        "region_name": "eu-west-1",
        "endpoint_url": "http://sqs.local",
        "aws_access_key_id": "AKIA",
        "aws_secret_access_key": "secret",
        "aws_session_token": None,
    }
    assert built.shared_stream_key() == trigger.shared_stream_key()


def test_a_missing_connection_names_watcher_trigger_and_id() -> None:
    _, stored = KafkaMessageTrigger(topics="t", group_id="g", kafka_config_id="gone").serialize()
    with pytest.raises(TriggerLoadError) as caught:
        resolve_connections(KafkaMessageTrigger, stored, _lookup({}), where=WHERE)
    message = str(caught.value)
    assert message.startswith("trigger 7 of watcher 'orders': connection 'gone'")
    assert "kafka_config_id" in message and "SLUICE_CONN_GONE" in message


def test_an_unfit_connection_says_why() -> None:
    _, stored = KafkaMessageTrigger(topics="t", group_id="g", kafka_config_id="k").serialize()
    with pytest.raises(
        TriggerLoadError, match=r"cannot configure KafkaMessageTrigger.*no bootstrap"
    ):
        resolve_connections(KafkaMessageTrigger, stored, _lookup({"k": {}}), where=WHERE)


def test_kwargs_without_a_connection_id_are_left_alone() -> None:
    _, stored = KafkaMessageTrigger(topics="t", group_id="g", bootstrap_servers="b:1").serialize()
    assert resolve_connections(KafkaMessageTrigger, stored, _lookup({}), where=WHERE) == stored


def test_a_malformed_connection_uri_quotes_none_of_it_in_the_load_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The load error is logged and stored as the trigger row's error (``dags show``): a
    password with an unencoded ``/`` must not show up there as the "port"."""
    monkeypatch.setenv("SLUICE_CONN_K", "kafka://user:s3cr3tPart/rest@broker:9092")
    _, stored = KafkaMessageTrigger(topics="t", group_id="g", kafka_config_id="k").serialize()
    lookup = database_lookup(cast("Database", None), cast("KwargsCipher", None))  # env first
    with pytest.raises(TriggerLoadError) as caught:
        resolve_connections(KafkaMessageTrigger, stored, lookup, where=WHERE)
    shown = "".join(traceback.format_exception(caught.value))
    assert "connection 'k'" in shown and "percent-encode" in shown
    assert "s3cr3t" not in shown
