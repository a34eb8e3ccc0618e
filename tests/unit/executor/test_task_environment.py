from engine.logs import child_environment


def test_a_task_inherits_the_environment_without_the_engine_secrets() -> None:
    environ = {
        "PATH": "/usr/bin",
        "SLUICE__CORE__FERNET_KEY": "k1,k2",
        "SLUICE__CORE__SQL_ALCHEMY_CONN": "sqlite:////tmp/x.db",
        "SLUICE__METRICS__PORT": "9464",
        "SLUICE__CORE__EXTRA": "postgresql://u:p%40ssword@db/x",  # holds the password
        "PGPASSWORD": "p@ssword",  # the user's own setting: a task may need it
    }
    env = child_environment(environ, ["p@ssword"])
    assert env == {"PATH": "/usr/bin", "SLUICE__METRICS__PORT": "9464", "PGPASSWORD": "p@ssword"}
