"""The ``sluice`` command line, one module per noun; the top of the house.

``main`` holds the root group and the process commands (``run``, ``triggerer``, ...), and
adds the command groups of the other modules. May import every part of the engine.
"""

from __future__ import annotations

from engine.cli.main import cli, main

__all__: tuple[str, ...] = ("cli", "main")
