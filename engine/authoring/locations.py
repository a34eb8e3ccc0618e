"""Where in the user's code something was declared: the file and line of the innermost frame
outside the engine, for the messages of definition errors and for ``DAG.fileloc``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

_ENGINE_DIR: Final = str(Path(__file__).resolve().parents[1]) + os.sep  # all of engine/


def caller_file_and_line() -> tuple[str, int]:
    """File and line of the innermost frame outside the engine package (the user's code)."""
    filename, lineno, _ = caller_file_line_and_module()
    return filename, lineno


def caller_file_line_and_module() -> tuple[str, int, str | None]:
    """``caller_file_and_line`` and the name of that frame's module (its ``__name__``)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_ENGINE_DIR):
        frame = frame.f_back
    module = frame.f_globals.get("__name__")
    return frame.f_code.co_filename, frame.f_lineno, module if isinstance(module, str) else None


def caller_location() -> str:
    """``file:line`` of the innermost frame outside the engine package (the user's code)."""
    filename, lineno = caller_file_and_line()
    return f"{filename}:{lineno}"
