"""An ``sql:`` job whose replica stops or is cut off mid-transaction: no tick is lost.

Three real replicas, each behind its own TCP proxy, run a per-second ``sql:``
job against a real PostgreSQL; the replica running a tick is paused
(SIGSTOP) or cut off (its proxy holds every byte) for longer than the short
lease, or for a while under the default one. Every tick of the window must
end SUCCESS with exactly one effect: under the short lease the tick hit is
taken over once its lease lapsed (the owner's transaction does not outlive
it) and the owner's late outcome is fenced; under the default lease the owner
finishes it itself.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.checker import owner_pid
from tests.faults.proxy import Proxy, proxied
from tests.helpers.daemon_harness import Cluster, Replica, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

SHORT = "    lease: 3s\n    heartbeat: 1s\n    misfire_grace: 10s\n"
# A per-second job's default lease is a minute (its misfire_grace must exceed it).
DEFAULT = ""


def config(schema: str, lease: str) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "jobs:\n"
        "  tick:\n"
        '    cron: "* * * * * *"\n'
        "    concurrency: allow\n"
        f"{lease}"
        "    sql: |\n"
        f'      INSERT INTO "{schema}".sql_ledger (run_key, fencing_token)\n'
        "      SELECT :run_key, :fencing_token FROM pg_sleep(0.4)\n"
    )


def pause(replica: Replica, _: Proxy, seconds: float) -> None:
    replica.signal(signal.SIGSTOP)
    time.sleep(seconds)
    replica.signal(signal.SIGCONT)


def cut_off(_: Replica, proxy: Proxy, seconds: float) -> None:
    proxy.partition(seconds).wait(seconds + 5)


@pytest.mark.parametrize(
    ("lease", "fault", "seconds"),
    [
        pytest.param(SHORT, pause, 5.0, id="short-lease-sigstop"),
        pytest.param(SHORT, cut_off, 5.0, id="short-lease-cut"),
        pytest.param(DEFAULT, pause, 6.5, id="default-lease-sigstop"),
        pytest.param(DEFAULT, cut_off, 6.5, id="default-lease-cut"),
    ],
)
def test_a_stalled_or_cut_off_sql_owner_loses_no_tick(
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    lease: str,
    fault: Callable[[Replica, Proxy, float], None],
    seconds: float,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".sql_ledger (run_key text, fencing_token bigint)')
    direct = Cluster(pg_dsn, schema, tmp_path)
    path = direct.write_config(config(schema, lease))
    by_pid: dict[int, tuple[Replica, Proxy]] = {}
    with contextlib.ExitStack() as stack:
        for n in range(3):
            # Each behind a proxy of its own: the one cut off is alone.
            proxy, dsn = stack.enter_context(proxied(pg_dsn))
            env = {**direct.env(), "PGCROND_DATABASE_URL": dsn}
            replica = Replica(f"replica-{n}", path, tmp_path / f"replica-{n}.log", env).start()
            stack.callback(replica.stop)
            by_pid[replica.pid] = (replica, proxy)
        for replica, _ in by_pid.values():
            replica.wait_event("daemon_ready", timeout=30)
        window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        time.sleep(2.5)

        def holder() -> tuple[Replica, Proxy, dict[str, Any]] | None:
            """A replica inside its job's transaction: the row it holds is locked."""
            for row in direct.rows(
                "SELECT run_key, owner, fencing_token, expires_at FROM {leases} "
                "WHERE status = 'RUNNING' AND expires_at > now() AND id NOT IN ("
                "  SELECT id FROM {leases} WHERE status = 'RUNNING' FOR KEY SHARE SKIP LOCKED)"
            ):
                hit = by_pid.get(owner_pid(row["owner"]) or 0)
                if hit is not None:
                    return hit[0], hit[1], row
            return None

        victim, proxy, hit = wait_until(holder, 10, "a replica mid-transaction", every=0.02)
        fault(victim, proxy, seconds)
        window_end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)

        def settled() -> bool:
            return not direct.rows(
                "SELECT 1 FROM {leases} WHERE run_key <= %s AND status = 'RUNNING'",
                f"{window_end:%Y-%m-%dT%H:%M:%SZ}",
            )

        time.sleep(3)
        wait_until(settled, 20, "every tick of the window to finish")
    ticks = {row["run_key"]: row for row in direct.rows("SELECT * FROM {leases}")}
    effects: dict[str, list[int]] = {}
    for effect in direct.rows(f'SELECT * FROM "{schema}".sql_ledger'):
        effects.setdefault(effect["run_key"], []).append(effect["fencing_token"])
    expected = []
    moment = window_start
    while moment <= window_end:
        expected.append(f"{moment:%Y-%m-%dT%H:%M:%SZ}")
        moment += timedelta(seconds=1)
    final = ticks[hit["run_key"]]
    print(
        f"\nhit {hit['run_key']} (token {hit['fencing_token']}): ended {final['status']} "
        f"{final['reason']} {final['error']!r}, token {final['fencing_token']}, "
        f"taken at {final['acquired_at']}, lease of the hit to {hit['expires_at']}"
    )
    # Every tick of the window ended SUCCESS, its effect written once, by the
    # attempt that recorded it.
    assert {key: "SUCCESS" for key in expected} == {key: ticks[key]["status"] for key in expected}
    assert {key: [ticks[key]["fencing_token"]] for key in expected} == {
        key: effects.get(key) for key in expected
    }
    if lease == SHORT:
        # Taken over once its lease lapsed, promptly: the owner's transaction
        # ended with its lease, and its row lock with it.
        assert final["fencing_token"] > hit["fencing_token"]
        assert final["acquired_at"] - hit["expires_at"] < timedelta(seconds=1.5)
    else:
        # Its owner finished it: a stall inside the lease costs nothing.
        assert final["fencing_token"] == hit["fencing_token"]
