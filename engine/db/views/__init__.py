"""Read models: JSON-able dicts and lists composed from ``engine.db.queries``, the one answer
the CLI, the REST API and the web UI share (no query or composition written twice).

Import from the modules themselves: this package imports nothing.
"""
