"""``@dag``: a function that defines a DAG's tasks becomes a DAG factory (Airflow's ``@dag``).

::

    @dag(schedule="@daily", start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False)
    def orders(limit: int = 100):
        extract(limit) >> load()  # the function's docstring, if any, becomes doc_md

    orders()  # builds and registers the DAG "orders"

The decorator takes ``DAG``'s arguments (``dag_id`` defaults to the function name). The
function's parameters that have a value become the DAG's params; inside the function they
are ``DagParam`` placeholders that a ``@task`` call turns into the run's value of the param.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, overload

from engine.authoring.dag import DAG
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.params import DagParam

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


class DagFactory:
    """What ``@dag`` returns: calling it builds the DAG (registered like ``with DAG(...)``).

    The function runs inside the DAG's ``with`` block. Its parameters that have a value
    (a default or an argument of the call) become the DAG's params; the function receives
    them as ``DagParam`` placeholders, which a ``@task`` call resolves to the run's value.
    """

    def __init__(self, function: Callable[..., Any], dag_kwargs: Mapping[str, Any]) -> None:
        if not callable(function):
            raise DagDefinitionError(f"{caller_location()}: @dag decorates functions")
        functools.update_wrapper(self, function)
        self.function = function
        self.dag_kwargs = dict(dag_kwargs)

    def __repr__(self) -> str:
        return f"<@dag {getattr(self.function, '__qualname__', self.function)!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> DAG:
        options = dict(self.dag_kwargs)
        dag_id = options.pop("dag_id", None) or self.function.__name__
        if options.get("doc_md") is None and self.function.__doc__:
            options["doc_md"] = inspect.cleandoc(self.function.__doc__)
        signature = inspect.signature(self.function)
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise DagDefinitionError(f"{caller_location()}: @dag {dag_id!r}: {exc}") from exc
        bound.apply_defaults()
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        values = {
            name: value
            for name, value in bound.arguments.items()
            if signature.parameters[name].kind not in variadic
        }
        params = {**(options.pop("params", None) or {}), **values}
        with DAG(dag_id, params=params, **options) as new:
            for name in values:
                param = new.params[name]
                bound.arguments[name] = DagParam(name, param.value if param.has_value else None)
            self.function(*bound.args, **bound.kwargs)
        return new


@overload
def dag(function: Callable[..., Any], /) -> DagFactory: ...


@overload
def dag(dag_id: str | None = None, /, **dag_kwargs: Any) -> Callable[..., DagFactory]: ...


def dag(
    dag_id_or_function: str | Callable[..., Any] | None = None, /, **dag_kwargs: Any
) -> DagFactory | Callable[..., DagFactory]:
    """Turn a function into a DAG factory: ``@dag`` or ``@dag(schedule=..., ...)``.

    Takes ``DAG``'s arguments; ``dag_id`` defaults to the function name and ``doc_md`` to
    its docstring. Call the decorated function (``my_dag()``) to build the DAG.
    """
    if callable(dag_id_or_function):
        return DagFactory(dag_id_or_function, dag_kwargs)
    if dag_id_or_function is not None:
        dag_kwargs["dag_id"] = dag_id_or_function
    return functools.partial(DagFactory, dag_kwargs=dag_kwargs)
