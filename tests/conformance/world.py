"""What the kit's cases share: the DAG file of a case's watchers, the kit's messages, what the
database stored, and the figures table.

A case names its watchers (label -> ``watcher_source`` of one stream); ``dag_file`` makes
one asset ``kit-<label>`` per watcher and a DAG scheduled on all of them, as a user would.
``Stored`` reads back, per watcher, the kit's ``n`` and the dedup key of every asset event.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import select

from engine.db.models import Asset, AssetEvent
from tests.reporting import CONFORMANCE_PROPERTY

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import pytest

    from engine.db.database import Database
    from tests.conformance.broker import KitBroker

KINDS: Final = ("a", "b", "c")  # what sibling watchers filter on: "c" only the catch-all
#: the kit's usual siblings: watcher label -> the kind it takes (None: every message)
ABC: Final = {"a": "a", "b": "b", "all": None}

DAG_FILE: Final = """\
from functools import reduce
from operator import or_

from engine import DAG, Asset, AssetWatcher
{imports}

assets = [
{assets}
]

with DAG({dag_id!r}, schedule=reduce(or_, assets)):
    pass
"""


def dag_file(dag_id: str, imports: str, watchers: Mapping[str, str]) -> str:
    """A DAG file with one asset ``kit-<label>`` watched by each ``watchers[label]``."""
    assets = "\n".join(
        f"    Asset({f'kit-{label}'!r}, watchers=[AssetWatcher({f'watch-{label}'!r}, {src})]),"
        for label, src in watchers.items()
    )
    return DAG_FILE.format(imports=imports, assets=assets, dag_id=dag_id)


def message(n: int, **extra: Any) -> dict[str, Any]:
    """The kit's message ``n``: its kind cycles a, b, c."""
    return {"n": n, "kind": KINDS[n % len(KINDS)], **extra}


def expected(ns: Iterable[int], matches: Mapping[str, str | None]) -> dict[str, set[int]]:
    """Watcher label -> the ``n`` its filter takes (``matches``: label -> kind, None: all)."""
    return {
        label: {n for n in ns if kind is None or KINDS[n % len(KINDS)] == kind}
        for label, kind in matches.items()
    }


def n_of_raw(payload: bytes) -> int | None:
    """The kit's ``n`` of a dead-lettered payload (None: not a kit message)."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return body.get("n") if isinstance(body, dict) else None


@dataclass
class Stored:
    """Per watcher label: the ``n`` of each stored asset event, and each dedup key."""

    ns: dict[str, list[int]] = field(default_factory=dict)
    keys: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, db: Database, kit: KitBroker) -> Stored:
        query = select(Asset.name, AssetEvent.payload, AssetEvent.dedup_key).join(
            Asset, Asset.id == AssetEvent.asset_id
        )
        # read-only: on SQLite a snapshot without the write lock (never waits on a writer)
        rows = db.call(lambda s: s.execute(query).all(), read_only=True)
        stored = cls()
        for asset, payload, key in rows:
            label = asset.removeprefix("kit-")
            stored.ns.setdefault(label, []).append(kit.payload_n(payload))
            stored.keys.setdefault(label, []).append(key)
        return stored

    def total(self) -> int:
        return sum(len(ns) for ns in self.ns.values())

    def has(self, want: Mapping[str, set[int]]) -> bool:
        return all(set(self.ns.get(label, ())) >= ns for label, ns in want.items())

    def lost(self, want: Mapping[str, set[int]]) -> int:
        return sum(len(ns - set(self.ns.get(label, ()))) for label, ns in want.items())

    def duplicated(self) -> int:
        by_n = sum(n - 1 for ns in self.ns.values() for n in Counter(ns).values())
        by_key = sum(n - 1 for keys in self.keys.values() for n in Counter(keys).values())
        return max(by_n, by_key)

    def unexpected(self, want: Mapping[str, set[int]]) -> dict[str, set[int]]:
        return {
            label: extra
            for label, ns in self.ns.items()
            if (extra := set(ns) - want.get(label, set()))
        }

    def check(self, want: Mapping[str, set[int]], kit: KitBroker) -> None:
        """Exactly the wanted events, each once, keyed by the broker's identity."""
        assert not self.lost(want), f"lost per watcher: {self.missing(want)}"
        assert not self.duplicated(), f"duplicated asset events: {self.ns}"
        assert not self.unexpected(want), f"events a filter refuses: {self.unexpected(want)}"
        prefix = kit.dedup_prefix()
        wrong = [k for keys in self.keys.values() for k in keys if not (k or "").startswith(prefix)]
        assert not wrong, f"dedup keys not derived from the broker's identity ({prefix}): {wrong}"

    def missing(self, want: Mapping[str, set[int]]) -> dict[str, list[int]]:
        return {
            label: sorted(ns - set(self.ns.get(label, ())))[:10]
            for label, ns in want.items()
            if ns - set(self.ns.get(label, ()))
        }


def record_figures(
    request: pytest.FixtureRequest,
    kit: KitBroker,
    *,
    messages: int,
    stored: Stored,
    want: Mapping[str, set[int]],
    takeover_s: float | None = None,
) -> None:
    """Put this case's figures in its report (``tests/reporting.py`` prints the table)."""
    figures = {
        "broker": kit.kind,
        "case": request.node.name.split("[", 1)[0].removeprefix("test_"),
        "messages": messages,
        "events": stored.total(),
        "lost": stored.lost(want),
        "duplicated": stored.duplicated(),
        "takeover_s": takeover_s,
    }
    request.node.user_properties.append((CONFORMANCE_PROPERTY, figures))
