"""The fault proxy itself, against a real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.faults.proxy import Proxy, proxied
from tests.helpers.daemon_harness import wait_until


def connect(dsn: str) -> psycopg.Connection[Any]:
    # Short client timeouts: these tests are about the proxy, not libpq's patience.
    return psycopg.connect(dsn, autocommit=True, connect_timeout=3)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[tuple[Proxy, str]]:
    with proxied(pg_dsn) as pair:
        yield pair


def one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def fresh_query(dsn: str, query: str) -> Any:
    with connect(dsn) as conn:
        return one(conn, query)


def in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = target()
        except Exception as exc:
            box["error"] = exc
        box["at"] = time.monotonic()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


def test_passes_queries_through(proxy: tuple[Proxy, str]) -> None:
    server, dsn = proxy
    with connect(dsn) as conn:
        assert 42 == one(conn, "SELECT 42")
        assert "x" * 100_000 == one(conn, "SELECT repeat('x', 100000)")
    assert server.stats.accepted == 1
    wait_until(lambda: server.stats.bytes_down > 100_000, 5, "the bytes to be counted")


def test_cut_closes_every_connection_and_new_ones_work(proxy: tuple[Proxy, str]) -> None:
    server, dsn = proxy
    conns = [connect(dsn) for _ in range(3)]
    try:
        wait_until(lambda: server.open_connections == 3, 5, "three proxied connections")
        assert 3 == server.cut()
        for conn in conns:
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        with connect(dsn) as fresh:
            assert 1 == one(fresh, "SELECT 1")
    finally:
        for conn in conns:
            conn.close()


def test_partition_holds_bytes_and_delivers_them_at_the_heal(
    proxy: tuple[Proxy, str], pg_dsn: str
) -> None:
    server, dsn = proxy
    with connect(dsn) as conn, connect(pg_dsn) as direct:
        backend = one(conn, "SELECT pg_backend_pid()")
        started = time.monotonic()
        healed = server.partition(1.5)
        # The statement is sent during the partition and answered after it.
        thread, box = in_thread(lambda: one(conn, "SELECT clock_timestamp()"))
        time.sleep(0.5)
        # Held, not delivered: the server has not seen it (its backend is idle).
        state = one(direct, f"SELECT state FROM pg_stat_activity WHERE pid = {backend}")
        assert "idle" == state
        assert thread.is_alive()
        # A new connection is accepted but stalled too.
        late_thread, late_box = in_thread(lambda: fresh_query(dsn, "SELECT 7"))
        thread.join(5)
        late_thread.join(5)
        assert healed.is_set()
    assert "error" not in box and "error" not in late_box, (box, late_box)
    assert box["at"] - started >= 1.4
    assert late_box["value"] == 7 and late_box["at"] - started >= 1.4


def test_partition_delivers_writes_sent_before_it(proxy: tuple[Proxy, str], pg_dsn: str) -> None:
    server, dsn = proxy
    with connect(pg_dsn) as direct:
        direct.execute("CREATE TABLE IF NOT EXISTS proxy_held (n int)")
        direct.execute("TRUNCATE proxy_held")
        try:
            with connect(dsn) as conn:
                server.partition(1.0)
                thread, box = in_thread(lambda: conn.execute("INSERT INTO proxy_held VALUES (1)"))
                time.sleep(0.5)
                assert 0 == one(direct, "SELECT count(*) FROM proxy_held")
                thread.join(5)
                assert "error" not in box, box
            assert 1 == one(direct, "SELECT count(*) FROM proxy_held")
        finally:
            direct.execute("DROP TABLE proxy_held")


def test_blackhole_drops_and_refuses_then_resumes(proxy: tuple[Proxy, str]) -> None:
    server, dsn = proxy
    with connect(dsn) as idle, connect(dsn) as busy:
        healed = server.blackhole(1.0)
        with pytest.raises(psycopg.OperationalError):
            connect(dsn)
        started = time.monotonic()
        # A statement into the blackhole gets no answer; at the heal its
        # broken connection is closed.
        with pytest.raises(psycopg.OperationalError):
            busy.execute("SELECT 1")
        assert time.monotonic() - started >= 0.5
        assert healed.wait(5)
        assert server.stats.refused >= 1 and server.stats.dropped_bytes > 0
        # A connection that sent nothing meanwhile is intact.
        assert 1 == one(idle, "SELECT 1")
    with connect(dsn) as fresh:
        assert 1 == one(fresh, "SELECT 1")


def test_upstream_down_closes_the_client(pg_dsn: str) -> None:
    with Proxy("127.0.0.1", 1) as server, pytest.raises(psycopg.OperationalError):
        connect(server.dsn(pg_dsn))
