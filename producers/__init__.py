"""producers package."""

from __future__ import annotations

__all__: tuple[str, ...] = ()
