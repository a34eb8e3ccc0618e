"""The screenshots the browser tests take: listed at the end of the run (each test hands its
own to its report, which also reaches the main process under pytest-xdist; the root
conftest prints them), and the DAG list also saved for the README (docs/ui-dag-list.png) when asked.

``SLUICE_DOCS_SCREENSHOTS=docs pytest tests/browser`` refreshes ``docs/ui-dag-list.png``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Final

#: Set to a folder (the repo's ``docs``) to also save the README's screenshots there.
DOCS_SCREENSHOT_ENV: Final = "SLUICE_DOCS_SCREENSHOTS"

_TAKEN: list[Path] = []


def record_screenshot(path: Path, *, docs_name: str | None = None) -> None:
    """Note a screenshot for the end-of-run list; copy it to the docs folder when asked."""
    _TAKEN.append(path)
    print(f"screenshot: {path}")
    docs = os.environ.get(DOCS_SCREENSHOT_ENV)
    if docs and docs_name:
        shutil.copyfile(path, Path(docs) / docs_name)


def drain() -> list[Path]:
    """The screenshots taken since the last call."""
    taken = list(_TAKEN)
    _TAKEN.clear()
    return taken
