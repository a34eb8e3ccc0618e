"""The packages DAG files import load their names on first use (PEP 562), so a child that
needs one part (a task step, a DAG file parse) does not import the others; the public
names keep working and stay visible to type checkers."""

from __future__ import annotations

import subprocess
import sys

import pytest

import engine
import engine.authoring
import producers
import shared_stream
import triggers


def _loaded(code: str, modules: tuple[str, ...]) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


def test_the_task_runner_imports_no_trigger_runtime_nor_jinja2_nor_croniter() -> None:
    """Jinja2 loads with the first template rendered, croniter with the first cron
    expression read: a task without templates in a DAG without a cron schedule needs neither."""
    light = ("anyio", "asyncio", "watchfiles", "triggers.watch", "triggers.file")
    assert _loaded("import engine.execution.task_runner", (*light, "jinja2", "croniter")) == []


def test_jinja2_and_croniter_load_where_they_are_used() -> None:
    code = (
        "from datetime import UTC, datetime\n"
        "from engine import DAG\n"
        "from engine.execution.templates import render_template\n"
        "assert render_template(['plain', 'no tag'], {}) == ['plain', 'no tag']\n"
        "assert 'jinja2' not in sys.modules\n"
        "assert render_template('{{ 1 + 1 }}', {}) == '2'\n"
        "DAG('asset_or_manual', schedule=None)\n"
        "assert 'croniter' not in sys.modules\n"
        "DAG('cron', schedule='30 2 * * *', start_date=datetime(2026, 1, 1, tzinfo=UTC))"
    )
    assert _loaded(f"import sys\n{code}", ("jinja2", "croniter")) == ["jinja2", "croniter"]


def test_importing_engine_imports_no_authoring_module() -> None:
    assert _loaded("import engine", ("engine.authoring.dag", "jinja2")) == []


def test_a_name_loads_only_its_module() -> None:
    code = "from engine import DAG, task\nfrom triggers import TimeDeltaTrigger"
    assert _loaded(code, ("anyio", "watchfiles", "engine.authoring.external_task")) == []


@pytest.mark.parametrize("package", [engine, engine.authoring, triggers, shared_stream, producers])
def test_every_public_name_resolves(package) -> None:
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))


def test_task_carries_its_decorators() -> None:
    from engine import task

    assert all(callable(getattr(task, a)) for a in ("bash", "branch", "short_circuit", "sensor"))


def test_a_submodule_is_an_attribute_and_a_missing_name_an_attribute_error() -> None:
    assert engine.authoring.dag.__name__ == "engine.authoring.dag"  # the module, not @dag
    assert callable(engine.dag) and engine.dag.__module__ == "engine.authoring.decorators"
    for package in (engine, engine.authoring, triggers, shared_stream, producers):
        with pytest.raises(AttributeError):
            package.NoSuchName  # noqa: B018


def test_task_from_its_own_module_carries_its_decorators_in_a_fresh_interpreter() -> None:
    # Not through ``engine``'s lazy ``task``: the sub-decorators load on their first call.
    code = (
        "from engine.authoring.operators import task\n"
        "@task.bash\n"
        "def hello():\n"
        "    return 'echo hi'\n"
        "assert type(hello).__name__ == 'BashTaskFactory', type(hello)\n"
        "@task.short_circuit(ignore_downstream_trigger_rules=False)\n"
        "def gate():\n"
        "    return True\n"
        "assert type(gate).__name__ == 'ShortCircuitTaskFactory', type(gate)"
    )
    assert _loaded(code, ("engine.authoring.bash", "engine.authoring.branching")) == [
        "engine.authoring.bash",
        "engine.authoring.branching",
    ]


def test_a_triggers_submodule_is_an_attribute_in_a_fresh_interpreter() -> None:
    code = "import triggers\nassert triggers.temporal.DateTimeTrigger.__name__ == 'DateTimeTrigger'"
    assert _loaded(code, ("triggers.temporal",)) == ["triggers.temporal"]
