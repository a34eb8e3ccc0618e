"""A task that defers once per item: each deferral frees its worker slot.

The resumed method receives the event and the kwargs it passed to ``defer``; it defers again
until every item is done. Runs when ``region-us`` is updated
(``touch "${SLUICE_HOME:-$HOME/.sluice}/inbox/us.flag"``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from engine import DAG, Asset, BaseOperator
from triggers import TimeDeltaTrigger


class ProcessItemsOneByOne(BaseOperator):
    def __init__(self, *, items: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items = items

    def execute(self, context: dict[str, Any]) -> None:
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=1)),
            method_name="next_item",
            kwargs={"index": 0},
        )

    def next_item(self, context: dict[str, Any], event: Any = None, index: int = 0) -> list[str]:
        print(f"processed {self.items[index]} (woken by {event})")
        if index + 1 < len(self.items):
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=1)),
                method_name="next_item",
                kwargs={"index": index + 1},
            )
        return self.items


with DAG("example_multiple_deferrals", schedule=Asset("region-us")) as dag:
    ProcessItemsOneByOne(task_id="process_items", items=["alpha", "beta", "gamma"])
