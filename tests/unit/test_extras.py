"""A DAG or a configuration that needs a package only an extra installs, without it: the
error names what needs it, the package and ``pip install 'sluice[<extra>]'``. Each case runs
the engine's own code in a fresh interpreter that cannot import the package
(``sys.modules[name] = None``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from triggers.exceptions import MissingExtraError
from triggers.extras import EXTRA_OF, importing_extra, missing_extra, require_extra

if TYPE_CHECKING:
    from pathlib import Path

KAFKA_DAG = """\
from engine import DAG, Asset, AssetWatcher
from producers import KafkaMessageTrigger

orders = Asset(
    "orders",
    watchers=[
        AssetWatcher(
            "all",
            KafkaMessageTrigger(topics="orders", group_id="g", bootstrap_servers="b:9092"),
        )
    ],
)

with DAG("on_orders", schedule=orders):
    pass
"""
KAFKA_HINT = (
    "KafkaMessageTrigger needs the 'aiokafka' package, which is not installed: install the "
    "'kafka' extra (pip install 'sluice[kafka]', or 'sluice[all]')"
)


def _without(module: str, code: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` where ``module`` cannot be imported; its standard output."""
    script = f"import sys\nsys.modules[{module!r}] = None\n" + textwrap.dedent(code)
    out = subprocess.run(
        [sys.executable, "-P", "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_dag_file_using_a_trigger_without_its_extra_fails_to_parse_with_the_hint(
    tmp_path: Path,
) -> None:
    dag_file = tmp_path / "orders.py"
    dag_file.write_text(KAFKA_DAG)
    code = """
        import json
        from pathlib import Path
        from engine.dag_processing.parsing import parse_file
        result = parse_file(Path(sys.argv[1]))
        print(json.dumps([result.error.type, result.error.describe(result.fileloc)]))
    """
    kind, described = json.loads(_without("aiokafka", code, str(dag_file)))
    assert kind == "MissingExtraError"
    assert described == f"{dag_file}:9: MissingExtraError: {KAFKA_HINT}"


def test_the_triggerer_fails_the_trigger_with_the_hint() -> None:
    code = """
        from cryptography.fernet import Fernet
        from engine.crypto import KwargsCipher
        from engine.db.queries.triggers import TriggerRow
        from engine.exceptions import TriggerLoadError
        from engine.triggerer.loading import load_rows

        cipher = KwargsCipher(Fernet.generate_key().decode())
        stored = {"topics": ["orders"], "group_id": "g", "bootstrap_servers": "b:9092"}
        row = TriggerRow(
            id=7,
            classpath="producers.kafka_trigger.KafkaMessageTrigger",
            kwargs=cipher.encrypt_kwargs(stored, owner="trigger 7"),
            kind="watcher",
        )
        (loaded,) = load_rows([row], {}, cipher=cipher, allowed_modules=["producers"],
                              plugins_folder=None, lookup=lambda conn_id: None)
        try:
            loaded.instantiate()
        except TriggerLoadError as exc:
            print(exc)
    """
    message = _without("aiokafka", code).strip()
    assert message.startswith("cannot instantiate producers.kafka_trigger.KafkaMessageTrigger")
    assert message.endswith(f"MissingExtraError: {KAFKA_HINT}")


@pytest.mark.parametrize(
    ("module", "trigger", "build"),
    [
        (
            "aiokafka",
            "KafkaMessageTrigger(topics='t', group_id='g', bootstrap_servers='b:1')",
            "KafkaMessageTrigger.create_shared_stream_producer(trigger.serialize()[1])",
        ),
        ("aiobotocore", "SqsMessageTrigger(queue_url='http://q/1/a')", "trigger.build_producer()"),
    ],
)
def test_a_client_that_fails_to_import_where_the_trigger_runs_names_the_extra(
    module: str, trigger: str, build: str
) -> None:
    """Built while the client was there, the trigger's producer is built (what its
    shared-stream group does first) once the client is gone: the same error."""
    code = f"""
        import sys
        from producers import KafkaMessageTrigger, SqsMessageTrigger
        from triggers.exceptions import MissingExtraError
        trigger = {trigger}
        sys.modules[{module!r}] = None
        try:
            {build}
        except MissingExtraError as exc:
            print(exc)
    """
    out = subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert f"needs the {module!r} package, which is not installed" in out
    assert f"pip install 'sluice[{EXTRA_OF[module]}]'" in out


def test_the_celery_executor_without_celery_is_a_config_error(tmp_path: Path) -> None:
    code = """
        from click.testing import CliRunner
        from engine.cli.main import cli
        runner = CliRunner()
        migrated = runner.invoke(cli, ["db", "migrate"], obj={})
        assert migrated.exit_code == 0, migrated.output
        for args in (["executor"], ["celery", "worker"]):
            result = runner.invoke(cli, args, obj={})
            print(result.exit_code, result.output.strip().splitlines()[-1])
    """
    env = {"SLUICE_HOME": str(tmp_path), "SLUICE__EXECUTOR__KIND": "celery", "PATH": "/usr/bin"}
    lines = _without("celery", code, env=env).splitlines()
    hint = "needs the 'celery' package, which is not installed: install the 'celery' extra"
    assert len(lines) == 2
    for line, who in zip(
        lines, ['[executor] kind = "celery"', "sluice celery worker"], strict=True
    ):
        assert line.startswith(f"1 error: {who} {hint}"), line


# -- the table and its helpers, in process ------------------------------------------------


def test_every_extra_named_in_the_table_is_one_of_the_distribution() -> None:
    from importlib.metadata import metadata

    assert set(EXTRA_OF.values()) <= set(metadata("sluice").get_all("Provides-Extra") or [])


def test_an_installed_module_is_not_missing() -> None:
    assert missing_extra("aiokafka", needed_by="x") is None
    require_extra("celery", needed_by="x")


def test_an_unrelated_import_error_passes_through() -> None:
    with pytest.raises(ModuleNotFoundError), importing_extra("x"):
        import no_such_module_here  # type: ignore[import-not-found]  # noqa: F401
    with pytest.raises(MissingExtraError, match=r"pip install 'sluice\[sqs\]'") as caught:
        with importing_extra("SqsMessageTrigger"):
            raise ModuleNotFoundError("No module named 'botocore'", name="botocore")
    assert caught.value.name == "botocore"
    assert isinstance(caught.value, ImportError)
