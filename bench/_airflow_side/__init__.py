"""Scripts run by the Airflow bench venv's python (bench/.venv-airflow), never by Sluice's.

Each script prints one JSON line per measurement on stdout; ``bench/compare_airflow.py``
starts them as subprocesses and alternates them with the Sluice side.
"""
