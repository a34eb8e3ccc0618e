"""From a claimed trigger row to what the runtime runs: import, decrypt, instantiate.

The rows of a claim round are loaded in a worker thread (``load_rows``): each class of the
round is imported once, only from the allowed modules (a first import of, say, aiokafka takes
a few hundred ms and must not block the loop), and each row's kwargs are decrypted. The
triggerer then instantiates each one on the loop (``Loaded.instantiate``) and starts it
(``Loaded.spec``). Connection ids among the kwargs (``kafka_config_id``, ...) are resolved
here too, through the ``lookup`` the triggerer passes (``engine.triggerer.connections``:
the environment, then the database). Whatever fails is a ``TriggerLoadError`` naming the
row's reason, which the triggerer logs and reports; nothing here logs, or touches the
database but through ``lookup``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.exceptions import DecryptionError, TriggerLoadError
from engine.loader import import_trigger_class, instantiate_trigger
from engine.states import TriggerKind
from engine.triggerer.connections import resolve_connections
from engine.triggerer.handles import TriggerSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from engine.crypto import KwargsCipher
    from engine.db.queries import triggers as trigger_rows
    from triggers.base import BaseTrigger

__all__ = ("Loaded", "load_rows")


@dataclass(frozen=True, slots=True)
class Loaded:
    """A claimed row made ready to instantiate on the loop: its class and kwargs, or why not."""

    row: trigger_rows.TriggerRow
    cls: type[BaseTrigger] | None
    kwargs: dict[str, object] | None
    error: str | None
    served: trigger_rows.Served | None = None

    @property
    def kind(self) -> TriggerKind:
        return TriggerKind(self.row.kind)

    def instantiate(self) -> BaseTrigger:
        """The trigger of the row; ``TriggerLoadError`` when it cannot be built."""
        if self.error is not None:
            raise TriggerLoadError(self.error)
        assert self.cls is not None and self.kwargs is not None
        return instantiate_trigger(self.cls, self.row.classpath, self.kwargs)

    def spec(self, trigger: BaseTrigger) -> TriggerSpec:
        """What to start: ``trigger`` with what its row serves (log fields, watcher)."""
        served = self.served
        return TriggerSpec(
            trigger_id=self.row.id,
            trigger=trigger,
            kind=self.kind,
            log_fields=None if served is None else served.log_fields,
            watcher=None if served is None else served.watcher,
        )


def load_rows(
    rows: Sequence[trigger_rows.TriggerRow],
    served: Mapping[int, trigger_rows.Served],
    *,
    cipher: KwargsCipher,
    allowed_modules: Sequence[str],
    plugins_folder: Path | None,
    lookup: Callable[[str], dict[str, Any] | None] | None = None,
) -> list[Loaded]:
    """In a worker thread: import each class of the round once and decrypt every row."""
    classes: dict[str, type[BaseTrigger] | TriggerLoadError] = {}
    for classpath in {row.classpath for row in rows}:
        try:
            classes[classpath] = import_trigger_class(
                classpath, allowed=allowed_modules, plugins_folder=plugins_folder
            )
        except TriggerLoadError as exc:
            classes[classpath] = exc
    loaded = [_decrypt(cipher, row, classes[row.classpath], served.get(row.id)) for row in rows]
    return [_with_connections(item, lookup) for item in loaded]


def _with_connections(
    item: Loaded, lookup: Callable[[str], dict[str, Any] | None] | None
) -> Loaded:
    if item.cls is None or item.kwargs is None or not getattr(item.cls, "connection_kwargs", ()):
        return item
    watcher = item.served.watcher if item.served is not None else None
    where = f"trigger {item.row.id}" + (f" of watcher {watcher[1]!r}" if watcher else "")
    if lookup is None:
        return replace(item, cls=None, kwargs=None, error=f"{where}: no connection lookup")
    try:
        kwargs = resolve_connections(item.cls, item.kwargs, lookup, where=where)
    except TriggerLoadError as exc:
        return replace(item, cls=None, kwargs=None, error=str(exc))
    return replace(item, kwargs=kwargs)


def _decrypt(
    cipher: KwargsCipher,
    row: trigger_rows.TriggerRow,
    cls: type[BaseTrigger] | TriggerLoadError,
    served: trigger_rows.Served | None,
) -> Loaded:
    if isinstance(cls, TriggerLoadError):
        return Loaded(row, None, None, str(cls), served)
    try:
        kwargs = cipher.decrypt_kwargs(row.kwargs, trigger_id=row.id)
    except DecryptionError as exc:
        return Loaded(row, None, None, str(exc), served)
    return Loaded(row, cls, kwargs, None, served)
