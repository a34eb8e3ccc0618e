"""What every long-running part has in common: its ``job`` row, from insert to end.

Owns the job service a part runs inside (``service``: register the row, heartbeat it, end
it on the way out, cancellation included), the heartbeat loop (``heartbeat``: a failed beat
is logged and retried, a row no longer ``running`` is reported), and the wake-up on rows
other processes write (``wakeup``: PostgreSQL ``LISTEN/NOTIFY`` with its reconnect
backoff, inotify on a SQLite database's directory). The statements and the ``LISTEN``
connection are ``engine.db``'s (``queries.jobs``, ``listen``).

May import ``engine.db``, ``engine.states`` and the leaf utilities; imported by the runtime
parts (DAG processor, scheduler, executor, triggerer, API server), never by ``engine.db``
nor by the read model. Imports nothing itself: import the modules.
"""
