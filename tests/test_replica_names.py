"""Replica names stay unique where ``host:pid`` does not: containers sharing a host name.

The rule (pgcrond.core.replica) is pure, so two replicas with the same host
and pid are made here by giving both the same facts; the daemon's start-up
line that says how its name was chosen is read from a real ``pgcrond run``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pgcrond.config.loader import load_config
from pgcrond.core.replica import (
    KUBERNETES_ENV,
    MAX_NAME_LENGTH,
    REPLICA_ENV,
    choose,
    new_suffix,
)
from pgcrond.daemon.lifecycle import Daemon
from pgcrond.errors import ValidationError
from pgcrond.storage.leases import default_owner
from tests.helpers.daemon_harness import LEDGER, PGCROND, Replica, cluster, wait_until


def test_two_replicas_with_the_same_host_and_pid_get_different_names() -> None:
    """Host networking and a PID namespace each: both containers are ``vm:6``."""
    facts = {"hostname": "vm", "pid": 6, "env": {"HOSTNAME": "vm"}}
    first = choose(**facts, suffix=new_suffix())  # type: ignore[arg-type]
    second = choose(**facts, suffix=new_suffix())  # type: ignore[arg-type]
    assert first.name != second.name
    assert [True, True] == [n.name.startswith("vm:6-") for n in (first, second)]
    assert ["suffix", "suffix"] == [first.chosen_by, second.chosen_by]


def test_in_kubernetes_a_replica_is_named_by_its_pod_and_pid() -> None:
    env = {"HOSTNAME": "pgcrond-7d4b9c-x2l8q", KUBERNETES_ENV: "10.96.0.1"}
    chosen = choose(hostname="pgcrond-7d4b9c-x2l8q", pid=7, env=env, suffix="ab12cd")
    assert ("pgcrond-7d4b9c-x2l8q:7", "pod") == (chosen.name, chosen.chosen_by)


def test_hostname_outside_kubernetes_still_gets_the_suffix() -> None:
    """Docker and podman set HOSTNAME too, to the host's own name on the host network."""
    chosen = choose(hostname="vm", pid=6, env={"HOSTNAME": "vm"}, suffix="ab12cd")
    assert ("vm:6-ab12cd", "suffix") == (chosen.name, chosen.chosen_by)


def test_the_option_wins_over_the_environment_which_wins_over_the_pod() -> None:
    env = {REPLICA_ENV: "from-env", "HOSTNAME": "pod-1", KUBERNETES_ENV: "10.96.0.1"}
    facts = {"hostname": "pod-1", "pid": 7, "env": env, "suffix": "ab12cd"}
    given = choose(**facts, given="from-option")  # type: ignore[arg-type]
    from_env = choose(**facts)  # type: ignore[arg-type]
    assert ("from-option", "option") == (given.name, given.chosen_by)
    assert ("from-env", "environment") == (from_env.name, from_env.chosen_by)


def test_an_empty_PGCROND_REPLICA_counts_as_unset() -> None:
    chosen = choose(hostname="vm", pid=6, env={REPLICA_ENV: ""}, suffix="ab12cd")
    assert ("vm:6-ab12cd", "suffix") == (chosen.name, chosen.chosen_by)


@pytest.mark.parametrize(
    "bad", ["", "two words", "tab\there", "nul\x00", "x" * (MAX_NAME_LENGTH + 1)]
)
def test_a_name_that_cannot_name_a_replica_is_refused_naming_its_source(bad: str) -> None:
    with pytest.raises(ValidationError) as given:
        choose(hostname="vm", pid=6, env={}, suffix="ab12cd", given=bad)
    assert "--replica" == given.value.field
    if bad:
        with pytest.raises(ValidationError) as from_env:
            choose(hostname="vm", pid=6, env={REPLICA_ENV: bad}, suffix="ab12cd")
        assert REPLICA_ENV == from_env.value.field


def test_one_process_gives_itself_one_name() -> None:
    """Every lease store a process opens without an owner writes the same name."""
    if os.environ.get(REPLICA_ENV) or os.environ.get(KUBERNETES_ENV):
        pytest.skip("the suite runs with an explicit or pod name")
    name = default_owner()
    assert name == default_owner()
    assert name.startswith(f"{socket.gethostname()}:{os.getpid()}-")


def daemon_config(tmp_path: Path, schema: str = "pgcrond") -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "jobs:\n"
        f'  tick: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
    )
    return path


@pytest.mark.parametrize(
    ("given", "env", "expected"),
    [
        ("from-option", {REPLICA_ENV: "from-env"}, ("from-option", "option")),
        (None, {REPLICA_ENV: "from-env"}, ("from-env", "environment")),
    ],
)
def test_the_daemon_logs_how_its_name_was_chosen(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    given: str | None,
    env: dict[str, str],
    expected: tuple[str, str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = daemon_config(tmp_path)
    config = load_config([path], database_url="postgresql://127.0.0.1:1/none")
    with capture_logs() as logs:
        daemon = Daemon(config, [str(path)], replica=given)
    named = [e for e in logs if e["event"] == "replica_named"]
    assert [expected] == [(e["replica"], e["chosen_by"]) for e in named]
    assert expected[0] == daemon.replica


@pytest.mark.usefixtures("system_processes")
def test_run_says_how_its_name_was_chosen_and_records_its_runs_under_it(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The start-up line until a registry exists; the lease table shows the same name."""
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = daemon_config(tmp_path, schema)
        named = Replica("named", path, tmp_path / "named.log", running.env(), ["--replica", "a-1"])
        automatic = Replica("automatic", path, tmp_path / "automatic.log", running.env())
        running.replicas.extend([named.start(), automatic.start()])
        first = named.wait_event("replica_named", timeout=30)
        second = automatic.wait_event("replica_named", timeout=30)
        assert ("a-1", "option") == (first["replica"], first["chosen_by"])
        assert "suffix" == second["chosen_by"]
        assert second["replica"].startswith(f"{socket.gethostname()}:{automatic.pid}-")
        for replica, event in ((named, first), (automatic, second)):
            assert event["replica"] == replica.wait_event("daemon_ready", timeout=30)["replica"]
        owners = wait_until(
            lambda: (
                {r["owner"] for r in running.rows("SELECT owner FROM {leases}")}
                >= {"a-1", second["replica"]}
                and {r["owner"] for r in running.rows("SELECT owner FROM {leases}")}
            ),
            30,
            "runs won by both replicas",
        )
        assert owners <= {"a-1", second["replica"]}
        for replica in (named, automatic):
            replica.signal(signal.SIGTERM)
        assert [0, 0] == [named.wait_exit(45), automatic.wait_exit(45)]


@pytest.mark.usefixtures("system_processes")
def test_run_refuses_a_replica_name_with_a_space() -> None:
    result = subprocess.run(
        [str(PGCROND), "run", "-c", "config/example.yaml", "--replica", "two words"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert 2 == result.returncode
    assert "--replica: printable characters without spaces only" in result.stderr
