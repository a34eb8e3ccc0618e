"""What a task (or callback) process runs: Airflow 3's task-sdk ``execution_time``.

Owns the process the executor starts for one step of a task (``task_runner``) and for
callbacks (``callback_runner``); the wire protocol between it and the executor
(``protocol``: ``TaskSpec``, ``TaskResult``, ``CallbackSpec``, the exit codes) and its side
of the request channel (``task_channel``: the connection/variable store of the process);
what it does at start (``process``); loading the task or DAG from its DAG file, or from the
file's last good version (``loading``, ``last_good``); the context the task sees
(``context``), its results and the XCom API (``results``), what it writes for its outlets
(``outlets``), ``var`` / ``conn`` (``accessors``), template rendering (``templates``), the
execution deadline (``deadline``) and running callbacks (``callbacks``).

May import: ``engine.authoring`` (the DAG model and the ports it defines for the task
process: ``engine.authoring.store``, ``engine.authoring.context``), ``engine.states`` and the
leaf utilities; never ``engine.db`` nor SQLAlchemy (the task process has no database
access), nor another runtime part. Imported by ``engine.executor`` only (which starts the
processes and speaks the protocol); the scheduler side never imports it.

Import from the modules themselves: this package imports nothing, so that a task process
starts with only what it needs.
"""
