"""SQLAlchemy models of the metadata database, one module per table family: ``base``
(``Base``, ``UtcDateTime``), ``jobs`` (jobs, trigger rows, shared-stream snapshots),
``dags``, ``assets``, ``runs`` (backfills, DAG runs, task instances, pools, callback
requests, deadlines), ``secrets`` (connections, variables), ``state_store`` (the task and
asset state stores) and ``users``. The states stored in the rows are ``engine.states``.

Importing the package registers every table with ``Base.metadata`` (migrations and schema
checks compare against it); the models are imported from here.
"""

from engine.db.models.assets import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetEventQueue,
    AssetWatcher,
)
from engine.db.models.base import Base, UtcDateTime, utcnow
from engine.db.models.dags import (
    Dag,
    DagFile,
    DagParseError,
    DagScheduleAsset,
    DagScheduleAssetAlias,
    DagTask,
)
from engine.db.models.jobs import Job, SharedStreamSample, SharedStreamSnapshot, Trigger
from engine.db.models.runs import (
    Backfill,
    CallbackRequest,
    DagRun,
    DagRunAssetEvent,
    Deadline,
    Pool,
    TaskInstance,
)
from engine.db.models.secrets import StoredConnection, StoredVariable
from engine.db.models.state_store import AssetStateEntry, TaskStateEntry
from engine.db.models.users import ApiToken, UiSession, User

__all__ = (
    "ApiToken",
    "Asset",
    "AssetAlias",
    "AssetAliasAsset",
    "AssetEvent",
    "AssetEventQueue",
    "AssetStateEntry",
    "AssetWatcher",
    "Backfill",
    "Base",
    "CallbackRequest",
    "Dag",
    "DagFile",
    "DagParseError",
    "DagRun",
    "DagRunAssetEvent",
    "DagScheduleAsset",
    "DagScheduleAssetAlias",
    "DagTask",
    "Deadline",
    "Job",
    "Pool",
    "SharedStreamSample",
    "SharedStreamSnapshot",
    "StoredConnection",
    "StoredVariable",
    "TaskInstance",
    "TaskStateEntry",
    "Trigger",
    "UiSession",
    "User",
    "UtcDateTime",
    "utcnow",
)
