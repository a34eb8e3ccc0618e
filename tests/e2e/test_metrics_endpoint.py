"""``sluice run`` with ``[metrics] enabled``: scrape the Prometheus endpoint of a live engine."""

from __future__ import annotations

import json
import socket
import textwrap
import urllib.request
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import run_cli, sluice_env, start_cli, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

INBOX = {inbox!r}
RELEASE = {release!r}

# Same directory and cadence: one shared-stream group with two subscribers.
left = Asset("left", watchers=[AssetWatcher("left-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="left.flag", poke_interval=0.1))])
right = Asset("right", watchers=[AssetWatcher("right-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="right.flag", poke_interval=0.1))])


@task
def noop():
    return "ok"


@task
def hold():
    # Runs until the test creates RELEASE (at most a minute): meanwhile it holds a slot.
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(RELEASE) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "released"


with DAG("on_left", schedule=left):
    hold()

with DAG("on_right", schedule=right):
    noop()
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _setup(root: Path, template: Path, **settings: str) -> tuple[dict[str, str], Path]:
    home, dags, inbox = root / "home", root / "dags", root / "inbox"
    for folder in (home, dags, inbox):
        folder.mkdir()
    release = str(root / "release")
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox), release=release)))
    env = sluice_env(
        home,
        SLUICE__CORE__DAGS_FOLDER=str(dags),
        SLUICE__CORE__SQL_ALCHEMY_CONN=copy_sqlite_template(template, home / "sluice.db"),
        SLUICE__CORE__PARALLELISM="2",
        SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC="5",
        SLUICE__METRICS__ENABLED="true",
        **settings,
    )
    return env, inbox


def _listening_port(log: Path) -> int | None:
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("action") == "metrics_listening":
            return int(record["port"])
    return None


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample's value, None when the scrape does not have it (for wait conditions)."""
    return samples.get((name, frozenset(labels.items())))


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; a missing sample fails the test (it is not taken as 0)."""
    value = _sample(samples, name, **labels)
    if value is None:
        have = sorted({n for n, _ in samples if n.startswith(name)})
        raise AssertionError(f"no sample {name}{labels or ''} in the scrape (have: {have})")
    return value


def _scrape_when(port: int, what: str, **expected: float) -> Samples:
    """Scrape until each unlabelled sample in ``expected`` has its value."""

    def scrape() -> Samples | None:
        samples = _scrape(port)
        matches = all(_sample(samples, n) == v for n, v in expected.items())
        return samples if matches else None

    samples = wait_for(scrape, timeout=30, what=what)
    assert isinstance(samples, dict)
    return samples


def test_scrape_a_running_engine(tmp_path: Path, sqlite_template: Path) -> None:
    env, inbox = _setup(tmp_path, sqlite_template, SLUICE__METRICS__PORT="0")
    log = tmp_path / "engine.log"
    proc = start_cli("--log-format", "json", "run", env=env, log=log)
    try:
        port = wait_for(lambda: _listening_port(log), timeout=30, what="the metrics address")
        assert isinstance(port, int) and port > 0
        key = repr(("directory-scan", str(inbox), 0.1))
        group = {"key": key, "mode": "fast", "broker": "directory-scan"}
        before = wait_for(
            lambda: (
                (s := _scrape(port))
                and _sample(s, "sluice_shared_stream_subscribers", **group) == 2
                and s
            ),
            timeout=30,
            what="both watchers subscribed to one shared stream",
        )
        assert isinstance(before, dict)
        assert _value(before, "sluice_up") == 1
        assert _value(before, "sluice_triggers_running") == 2
        assert _value(before, "sluice_triggerer_capacity_left") == (
            _value(before, "sluice_triggerer_capacity") - 2
        )
        assert _value(before, "sluice_shared_stream_groups") == 1
        assert _value(before, "sluice_shared_stream_queue_depth", **group) >= 0
        assert _value(before, "sluice_task_slots_total") == 2
        assert _value(before, "sluice_task_slots_used") == 0
        runs = ("sluice_dag_runs_created_total", "asset_triggered")
        assert _value(before, runs[0], run_type=runs[1]) == 0

        (inbox / "left.flag").touch()
        # The run's task waits for the release file: its slot stays taken until then.
        running = _scrape_when(
            port, "the task of the new DAG run holding a slot", sluice_task_slots_used=1
        )
        assert _value(running, runs[0], run_type=runs[1]) == 1
        assert _value(running, "sluice_events_fired_total") == (
            _value(before, "sluice_events_fired_total") + 1
        )
        assert _value(running, "sluice_events_persisted_total") == (
            _value(before, "sluice_events_persisted_total") + 1
        )
        assert _value(running, "sluice_events_refused_total") == 0
        assert _value(running, "sluice_asset_events_created_total") == 1
        assert _value(running, "sluice_persister_commit_seconds_count") >= 1
        assert _value(running, "sluice_shared_stream_deliveries_total", **group) >= 2
        assert _value(running, "sluice_event_loop_responsive") == 1
        assert _value(running, "sluice_task_instances_claimed_total") == 1

        (tmp_path / "release").touch()
        done = _scrape_when(port, "the task finished and its slot freed", sluice_task_slots_used=0)
        assert _value(done, "sluice_task_outcomes_total", outcome="succeeded") == 1
    finally:
        code = stop(proc, timeout=30)
    assert code == 0, log.read_text()[-3000:]
    assert "Sluice stopped" in log.read_text()


def test_a_metrics_port_in_use_is_a_clear_error(tmp_path: Path, sqlite_template: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env, _ = _setup(tmp_path, sqlite_template, SLUICE__METRICS__PORT=str(port))
        result = run_cli("run", env=env, timeout=60)
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr
    assert "[metrics]" in result.stderr
    assert "Sluice ready" not in result.stderr
