"""The scheduler: asset conditions -> DAG runs -> ready task instances -> finished runs.

Owns the scheduling loop (``scheduler``), its pure decisions (``rules``) and the expansion
of mapped tasks into their copies (``expansion``). May import:
``engine.db``, ``engine.authoring`` and the leaf utilities; never another runtime part.

Import from the modules themselves: like every runtime part, this package imports
nothing, so that importing one module never loads the rest.
"""
