"""``python -m engine.cli``: the ``sluice`` command."""

from engine.cli.main import main

main()
