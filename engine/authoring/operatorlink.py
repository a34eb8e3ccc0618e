"""``BaseOperatorLink``: a link an operator adds to its task instances (Airflow's).

Declare it on the operator class, as Airflow does::

    class RunPageLink(BaseOperatorLink):
        name = "Job run"

        def get_link(self, operator, *, ti_key):
            return f"https://jobs.example.com/runs/{ti_key.run_id}/{operator.task_id}"

    class SubmitJobOperator(BaseOperator):
        operator_extra_links = (RunPageLink(),)

When a try of such a task succeeds, the task process computes each link (``get_link(operator,
ti_key=ti)``, ``ti`` being the try's task instance: ``dag_id``, ``task_id``, ``run_id``,
``map_index``, ``try_number``) and stores it with the try's results under ``xcom_key``
(``_link_<class name>``), as Airflow 3 stores it in XCom; ``sluice tasks show`` and the REST
API's task instance show it with the results. A ``get_link`` that raises is logged and
stores nothing.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)


class BaseOperatorLink:
    """A named link of an operator's task instances: ``name`` and ``get_link``."""

    #: the operator classes this link belongs to (Airflow's plugin registry reads it)
    operators: ClassVar[list[type[Any]]] = []
    name: ClassVar[str]

    @property
    def xcom_key(self) -> str:
        """The result key the link is stored under."""
        return f"_link_{type(self).__name__}"

    @abstractmethod
    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The link's URL for the task instance ``ti_key`` of ``operator``."""


def operator_links(operator: object, ti: object) -> Mapping[str, str]:
    """``xcom_key -> link`` for each of the operator's ``operator_extra_links``; a link whose
    ``get_link`` raises (or returns no str) is logged and left out."""
    links: dict[str, str] = {}
    declared = getattr(operator, "operator_extra_links", None) or getattr(
        getattr(operator, "operator_class", None), "operator_extra_links", ()
    )  # a mapped task's: its operator class's
    for link in declared or ():
        if not isinstance(link, BaseOperatorLink):
            continue
        try:
            url = link.get_link(operator, ti_key=ti)
        except Exception:  # user code: a broken link must not fail the task
            logger.exception(
                "operator link %s of task %r failed",
                type(link).__name__,
                getattr(operator, "task_id", None),
                extra={"action": "operator_link_failed", "link": type(link).__name__},
            )
            continue
        if isinstance(url, str) and url:
            links[link.xcom_key] = url
    return links
