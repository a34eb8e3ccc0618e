"""``ParamsDict``: a dict of ``Param`` objects that hands out their values (Airflow's).

::

    params = ParamsDict({"limit": Param(100, type="integer", minimum=1), "mode": "full"})
    params["limit"]            # 100: the value, checked against the Param's schema
    params["limit"] = 0        # ParamValidationError: the schema refuses it
    params.get_param("limit")  # the Param itself
    DAG("report", params=params)

Plain values become ``Param(value)``; assigning to an existing name checks the value
against that name's schema (``suppress_exception=True`` keeps a refused value instead of
raising). ``items()`` and ``values()`` are the ``Param`` objects, as Airflow's, so a
``ParamsDict`` goes wherever ``params=`` takes a dict.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, MutableMapping, ValuesView
from typing import Any

from engine.authoring.params import Param
from engine.exceptions import ParamValidationError


class ParamsDict(MutableMapping[str, Any]):
    """Names to ``Param``; reading a name gives its checked value."""

    __slots__ = ("_params", "suppress_exception")

    def __init__(
        self, dict_obj: Mapping[str, Any] | None = None, suppress_exception: bool = False
    ) -> None:
        self._params: dict[str, Param] = {}
        self.suppress_exception = suppress_exception
        for key, value in (dict_obj or {}).items():
            self[key] = value

    def __repr__(self) -> str:
        return f"ParamsDict({self._params!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ParamsDict):
            return self._params == other._params
        if isinstance(other, Mapping):
            return self.dump() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __contains__(self, key: object) -> bool:
        return key in self._params

    def __len__(self) -> int:
        return len(self._params)

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __delitem__(self, key: str) -> None:
        del self._params[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str) or not key:
            raise ParamValidationError(f"param names must be non-empty strings, got {key!r}")
        if isinstance(value, Param):
            self._params[key] = value
            return
        param = self._params.get(key)
        if param is None:
            self._params[key] = Param(value)
            return
        try:
            param.resolve(value, name=key)
        except ParamValidationError:
            if not self.suppress_exception:
                raise
        param.value = value

    def __getitem__(self, key: str) -> Any:
        param = self._params[key]
        if self.suppress_exception:
            return param.value
        return param.resolve(name=key)

    def get_param(self, key: str) -> Param:
        """The ``Param`` of ``key`` (``KeyError`` if none)."""
        return self._params[key]

    def items(self) -> ItemsView[str, Param]:  # Airflow's: the Params
        return ItemsView(self._params)

    def values(self) -> ValuesView[Param]:  # Airflow's: the Params
        return ValuesView(self._params)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add or set names; a ``ParamsDict`` given adds its ``Param`` objects."""
        for source in (*args, kwargs):
            if isinstance(source, ParamsDict):
                self._params.update(source._params)
            else:
                for key, value in dict(source).items():
                    self[key] = value

    def dump(self) -> dict[str, Any]:
        """Name -> value (unchecked), as plain data."""
        return {key: param.value for key, param in self._params.items()}

    def validate(self) -> dict[str, Any]:
        """Name -> checked value; ``ParamValidationError`` names the first bad one."""
        return {key: param.resolve(name=key) for key, param in self._params.items()}
