"""What the DAG processor is told: its folders, its bounds and its intervals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from engine.config import Config


@dataclass(frozen=True, slots=True)
class DagProcessorSettings:
    dags_folder: Path
    plugins_folder: Path | None = None
    file_timeout_s: float = 30.0
    #: ``[scheduler] min_file_process_interval``: every file is parsed again this often,
    #: changed or not, for what it reads at parse time (a Variable, an environment
    #: variable, another file); <= 0: never. Changed files are parsed at once.
    refresh_interval_s: float = 300.0
    #: ``[scheduler] dag_dir_list_interval``: the folders are listed this often (a ``stat``
    #: per file, no parse) for the changes the file watch missed (a network filesystem, a
    #: folder moved in whole); <= 0: never
    list_interval_s: float = 30.0
    parsing_processes: int = 2
    heartbeat_s: float = 5.0  # of its job row (``sluice jobs list``, ``sluice doctor``)
    #: configured secrets (Fernet keys, the database password): kept out of the children's
    #: environment, as the task processes' (``child_environment``)
    secrets: tuple[str, ...] = ()
    #: ``[core] dags_are_paused_at_creation``: new DAGs stored paused
    paused_at_creation: bool = False
    #: parse in children forked from a pre-imported parse runner (``parse_runner``) while
    #: ``DagProcessor.run`` runs; False: each file in a fresh interpreter
    parse_runner: bool = True

    @classmethod
    def from_config(cls, config: Config) -> DagProcessorSettings:
        return cls(
            dags_folder=config.core.dags_folder,
            plugins_folder=config.core.plugins_folder,
            file_timeout_s=config.core.dag_file_processor_timeout,
            refresh_interval_s=config.scheduler.min_file_process_interval,
            list_interval_s=config.scheduler.dag_dir_list_interval,
            heartbeat_s=config.scheduler.scheduler_heartbeat_sec,
            secrets=tuple(config.secret_values()),
            paused_at_creation=config.core.dags_are_paused_at_creation,
        )
