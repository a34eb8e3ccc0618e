"""Paused DAGs against a real ``sluice run``, paused and unpaused with the CLI.

An asset event that arrives while a DAG is paused is kept and, on unpause, creates the run
it would have created; with ``[scheduler] keep_events_while_paused = false`` it is dropped,
as Airflow does. A second DAG on the same asset, never paused, is the witness that the
scheduler has handled the event (no waiting for something not to happen).
"""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from tests.cli import invoke
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

pytestmark = pytest.mark.e2e

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

flags = Asset("flags", watchers=[AssetWatcher("flag", DirectoryFileDeleteTrigger(
    directory={inbox!r}, filename="go.flag", poke_interval=0.1))])


@task
def report(triggering_asset_events):
    return len(triggering_asset_events["flags"])


with DAG("paused_one", schedule=flags):
    report()

with DAG("witness", schedule=flags):
    report()
"""


def cli_json(env: Mapping[str, str], *args: str) -> Any:
    done = invoke(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def runs(env: Mapping[str, str], dag_id: str) -> list[dict[str, Any]]:
    return list(cli_json(env, "runs", "list", dag_id))


def asset_event_ids(env: Mapping[str, str]) -> list[int]:
    return [int(e["id"]) for e in cli_json(env, "assets", "events", "flags")]


def fire_and_wait_for_witness(env: Mapping[str, str], inbox: Path, witness_runs: int) -> int:
    """Drop the flag; once the witness has a run for it, return the new asset event's id."""
    before = set(asset_event_ids(env))
    (inbox / "go.flag").touch()
    wait_for(
        lambda: len(runs(env, "witness")) == witness_runs,
        timeout=30,
        what=f"witness run {witness_runs}",
    )
    [new] = set(asset_event_ids(env)) - before
    return new


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "dropped"])
def test_events_while_paused_are_kept_or_dropped(
    tmp_path: Path, migrated_sqlite_url: str, keep: bool
) -> None:
    inbox, dags = tmp_path / "inbox", tmp_path / "dags"
    inbox.mkdir()
    dags.mkdir()
    (dags / "paused.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    env = engine_env(
        tmp_path / "home",
        url=migrated_sqlite_url,
        dags=dags,
        SLUICE__SCHEDULER__KEEP_EVENTS_WHILE_PAUSED=str(keep).lower(),
    )
    engine = start_engine(env, tmp_path / "engine.log")
    try:
        wait_for(
            lambda: (
                {d["dag_id"] for d in cli_json(env, "dags", "list")} >= {"paused_one", "witness"}
            ),
            timeout=30,
            what="both DAGs parsed",
        )
        assert invoke("dags", "pause", "paused_one", env=env).returncode == 0
        assert cli_json(env, "dags", "show", "paused_one")["paused"] is True

        while_paused = fire_and_wait_for_witness(env, inbox, witness_runs=1)
        assert runs(env, "paused_one") == [], "a paused DAG ran"

        assert invoke("dags", "unpause", "paused_one", env=env).returncode == 0
        after = fire_and_wait_for_witness(env, inbox, witness_runs=2)
        expected = sorted([while_paused, after] if keep else [after])

        def events_in_runs() -> list[int]:
            return sorted(e for r in runs(env, "paused_one") for e in r["asset_events"])

        # The kept event and the new one may be taken by one run or by two (the scheduler may
        # see both queued at once), but each event is in exactly one run; a dropped event is
        # in none.
        wait_for(
            lambda: events_in_runs() == expected,
            timeout=30,
            what=f"the runs of paused_one to hold the asset events {expected}",
        )
    finally:
        assert stop(engine) == 0
