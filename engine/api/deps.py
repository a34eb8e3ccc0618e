"""What a request needs from the application: its metadata database and configuration.

Route modules annotate parameters with ``DatabaseDep`` / ``ConfigDep`` (or
``Depends(get_database)``); ``create_app`` puts both on ``app.state``.
"""

from typing import Annotated

from fastapi import Depends, Request

from engine.config import Config
from engine.db.database import Database


def get_database(request: Request) -> Database:
    """The metadata database of the application serving ``request``."""
    database: Database = request.app.state.database
    return database


def get_config(request: Request) -> Config:
    """The configuration of the application serving ``request``."""
    config: Config = request.app.state.config
    return config


DatabaseDep = Annotated[Database, Depends(get_database)]
ConfigDep = Annotated[Config, Depends(get_config)]
