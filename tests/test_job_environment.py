"""The database's DSN reaches no job's environment.

Stripping ``PGCROND_*``, ``PGPASSWORD``, ``PGPASSFILE`` and ``DATABASE_URL``
is not enough: a config saying ``url: ${MY_DSN}`` would hand ``MY_DSN`` (and
any other variable holding the same DSN) to every job. So every variable named
in ``database.url`` and every variable whose value holds the DSN or its
password is stripped from every job environment: commands, shell, isolated and
in-process entrypoints, and ``on_failure`` commands.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pgcrond.config.loader import load_config
from pgcrond.core.redaction import forget_all
from pgcrond.run.context import RunContext
from pgcrond.run.environment import job_environ
from tests.helpers.daemon_harness import Replica, at, cluster, wait_until

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")


def write_environ(ctx: RunContext) -> None:
    """A job that writes the environment it was given, one NAME=value a line."""
    lines = [f"{name}={value}" for name, value in sorted(ctx.env.items())]
    # Whole or absent: the test reads the file as soon as it exists.
    part = Path(ctx.env["ENV_OUT"] + ".part")
    part.write_text("\n".join(lines) + "\n")
    part.rename(ctx.env["ENV_OUT"])


def dump_env(out: Path, name: str) -> str:
    """A shell line writing its environment to ``out/name.env``, whole or absent."""
    return f"env > {out}/{name}.part && mv {out}/{name}.part {out}/{name}.env"


@pytest.mark.slow
def test_no_job_environment_holds_the_dsn(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    entry = "tests.test_job_environment:write_environ"
    jobs = (
        f"  command:\n"
        f'    at: "{at(4)}"\n'
        f'    command: [/bin/sh, -c, "{dump_env(out, "command")}; exit 3"]\n'
        f'    on_failure: {{command: [/bin/sh, -c, "{dump_env(out, "hook")}"], timeout: 5s}}\n'
        f"  shell:\n"
        f'    at: "{at(4)}"\n'
        f'    shell: "{dump_env(out, "shell")}"\n'
        f"  isolated:\n"
        f'    at: "{at(4)}"\n'
        f"    entrypoint: {entry}\n"
        f"    isolate: true\n"
        f"    env: {{ENV_OUT: {out}/isolated.env}}\n"
        f"  inprocess:\n"
        f'    at: "{at(4)}"\n'
        f"    entrypoint: {entry}\n"
        f"    env: {{ENV_OUT: {out}/inprocess.env}}\n"
    )
    text = (
        f"database:\n  url: ${{MY_DSN}}\n  schema: {schema}\n"
        # Everything passed through (the old default): still no DSN.
        'defaults: {misfire_grace: 30s, lease: 20s, env_passthrough: ["*"]}\n'
        f"jobs:\n{jobs}"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(text)
        env = {k: v for k, v in running.env().items() if k != "PGCROND_DATABASE_URL"}
        env.update(MY_DSN=pg_dsn, ALIAS_DSN=pg_dsn, KEEP_ME="1")
        replica = Replica("replica-0", path, tmp_path / "replica-0.log", env)
        running.replicas.append(replica.start())
        replica.wait_event("daemon_ready", timeout=30)
        names = ("command", "hook", "shell", "isolated", "inprocess")
        wait_until(
            lambda: all((out / f"{n}.env").exists() for n in names), 30, "every job's environment"
        )
        replica.wait_event("hook_sent", where=lambda e: e.get("job") == "command")
    for name in names:
        environ = (out / f"{name}.env").read_text()
        assert "KEEP_ME=1" in environ, name
        assert "PGCRON_IDEMPOTENCY_KEY=" in environ, name
        leaked = [
            line
            for line in environ.splitlines()
            if pg_dsn in line or line.startswith(("MY_DSN=", "ALIAS_DSN="))
        ]
        assert [] == leaked, name


def test_a_variable_holding_the_password_is_stripped_and_others_kept(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    database = {"url": "postgresql://app:${DB_PASSWORD}@${DB_HOST}/x"}
    j = {"cron": "* * * * *", "command": ["true"]}
    path.write_text(yaml.safe_dump({"database": database, "jobs": {"j": j}}))
    forget_all()
    try:
        load_config([path], environ={"DB_PASSWORD": "pw-4e9c1a77", "DB_HOST": "db.internal"})
        base = {
            "DB_PASSWORD": "pw-4e9c1a77",
            "DB_HOST": "db.internal",
            "OTHER_URL": "postgresql://app:pw-4e9c1a77@replica/x",
            "PATH": "/usr/bin:/bin",
            "HOME": "/root",
        }
        environ = job_environ({"MINE": "pw-4e9c1a77"}, {"PGCRON_ATTEMPT": "1"}, base)
    finally:
        forget_all()
    # A job's own env: is what it asked for, even a copy of the password.
    assert {
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "MINE": "pw-4e9c1a77",
        "PGCRON_ATTEMPT": "1",
    } == environ
