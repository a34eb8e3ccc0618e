"""Two real triggerer processes on PostgreSQL share triggers; kill -9 one, the other takes over.

Each trigger is a plugin ``RecordingTrigger`` that appends ``start``/``stop``/``fire`` lines
(with its pid) to one log file, so the test sees exactly which process runs which trigger,
and fires once the test creates its "go" file (after the takeover: never earlier, however
slowly a loaded machine starts the triggerers).
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance, Trigger
from engine.db.queries import triggers as trigger_rows
from engine.states import TaskState, TriggerKind
from tests.e2e.helpers import sluice_env, start_cli, stop, wait_for
from triggers.serde import loads

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

N_TRIGGERS = 2000
HEARTBEAT_S = 1.0
THRESHOLD_S = 2.1 * HEARTBEAT_S

PLUGIN = """
import os

from triggers import BaseTrigger, FileTrigger, TriggerEvent


def _log(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


class RecordingTrigger(BaseTrigger):
    def __init__(self, go_path, log_path):
        super().__init__()
        self.go_path = go_path
        self.log_path = log_path

    def serialize(self):
        return ("ha_plugin.RecordingTrigger", {"go_path": self.go_path, "log_path": self.log_path})

    async def run(self):
        _log(self.log_path, f"start {self.trigger_id} {os.getpid()}")
        try:
            # the go file, waited for by the engine's own FileTrigger
            async for _ in FileTrigger(self.go_path, poke_interval=0.05).run():
                break
        except BaseException:
            _log(self.log_path, f"stop {self.trigger_id} {os.getpid()}")
            raise
        _log(self.log_path, f"fire {self.trigger_id} {os.getpid()}")
        yield TriggerEvent({"trigger_id": self.trigger_id})
"""


def _running_by_pid(log: Path) -> dict[int, set[int]]:
    running: dict[int, set[int]] = defaultdict(set)
    if not log.exists():
        return running
    for line in log.read_text().splitlines():
        verb, trigger_id, pid = line.split()
        if verb == "start":
            running[int(pid)].add(int(trigger_id))
        else:
            running[int(pid)].discard(int(trigger_id))
    return running


def _seed(db: Database, cipher: KwargsCipher, go: Path, log: Path) -> list[int]:
    def seed(session):
        session.execute(insert(Dag).values(dag_id="ha", fileloc="ha.py"))
        run_id = session.execute(
            insert(DagRun).values(dag_id="ha", run_id="r1", run_type="manual").returning(DagRun.id)
        ).scalar_one()
        ids = []
        for i in range(N_TRIGGERS):
            tid = trigger_rows.add_trigger_row(
                session,
                cipher,
                "ha_plugin.RecordingTrigger",
                {"go_path": str(go), "log_path": str(log)},
                kind=TriggerKind.TASK,
            )
            session.execute(
                insert(TaskInstance).values(
                    dag_run_id=run_id,
                    dag_id="ha",
                    task_id=f"t{i}",
                    state=TaskState.DEFERRED,
                    trigger_id=tid,
                    next_method="execute_complete",
                )
            )
            ids.append(tid)
        return ids

    return db.call(seed)


def test_two_triggerers_share_and_survivor_takes_over_after_kill(
    migrated_pg_url: str, tmp_path: Path
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "ha_plugin.py").write_text(PLUGIN)
    log = tmp_path / "triggers.log"
    key = Fernet.generate_key().decode()
    db = Database(migrated_pg_url)
    go = tmp_path / "go"
    ids = set(_seed(db, KwargsCipher(key), go, log))

    env = sluice_env(
        tmp_path / "home",
        SLUICE__CORE__SQL_ALCHEMY_CONN=migrated_pg_url,
        SLUICE__CORE__FERNET_KEY=key,
        SLUICE__CORE__PLUGINS_FOLDER=str(plugins),
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC=str(HEARTBEAT_S),
    )
    small = start_cli("triggerer", "--capacity", "1000", env=env, log=tmp_path / "a.log")
    big = None
    try:
        # The small one fills its capacity first, then the big one takes the rest.
        wait_for(
            lambda: len(_running_by_pid(log).get(small.pid, ())) == 1000,
            timeout=30,
            what="the first triggerer to fill its capacity",
        )
        big = start_cli("triggerer", "--capacity", "2500", env=env, log=tmp_path / "b.log")

        def shared() -> bool:
            running = _running_by_pid(log)
            a, b = running.get(small.pid, set()), running.get(big.pid, set())
            return bool(a) and bool(b) and a | b == ids

        wait_for(shared, timeout=30, what="both triggerers to run all triggers between them")
        running = _running_by_pid(log)
        assert not running[small.pid] & running[big.pid], "a trigger runs in both processes"

        os.kill(small.pid, signal.SIGKILL)
        small.wait()
        killed_at = time.monotonic()
        wait_for(
            lambda: _running_by_pid(log).get(big.pid, set()) == ids,
            timeout=THRESHOLD_S + 2 + 5,
            what="the survivor to run every trigger",
        )
        takeover_s = time.monotonic() - killed_at
        assert takeover_s <= THRESHOLD_S + 2, f"takeover took {takeover_s:.1f}s"

        go.touch()  # every trigger fires now, in the survivor

        def all_resumed() -> bool:
            states = db.call(lambda s: list(s.execute(select(TaskInstance.state)).scalars()))
            return set(states) == {TaskState.SCHEDULED}

        wait_for(all_resumed, timeout=40, what="every deferred task to be resumed")
    finally:
        if small.poll() is None:
            small.kill()
            small.wait()
        if big is not None:
            assert stop(big) == 0

    fires = [line for line in log.read_text().splitlines() if line.startswith("fire")]
    assert sorted(int(line.split()[1]) for line in fires) == sorted(ids)  # each fired once
    rows = db.call(
        lambda s: s.execute(select(TaskInstance.next_kwargs, TaskInstance.trigger_id)).all()
    )
    assert all(trigger_id is None for _, trigger_id in rows)
    assert sorted(loads(kw)["event"]["trigger_id"] for kw, _ in rows) == sorted(ids)
    assert db.call(lambda s: s.execute(select(Trigger.id)).all()) == []
    db.dispose()
