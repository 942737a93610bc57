-- Named queries: a "-- name: NAME" line, then the statement. {table}, {migrations}
-- and {fencing_seq_name} are filled in with psycopg.sql; values are always bound.

-- name: claim
-- Claim an identity in one round trip: insert it, or reclaim a FAIL row whose
-- retry time has come or a RUNNING row whose lease expired (by the database
-- clock, against the expiry stored from the holder's own lease). When the
-- claim is refused, the current row is returned instead, to say why. When
-- forbid_overlap is set and another tick of the job holds a live lease, a
-- SKIPPED row is recorded in place of a RUNNING one.
WITH overlap AS (
    SELECT EXISTS (
        SELECT 1 FROM {table} o
        WHERE %(forbid_overlap)s AND o.code = %(code)s AND o.type = 'SCHEDULE'
          AND o.status = 'RUNNING' AND o.expires_at > clock_timestamp()
          AND o.lock_key <> %(lock_key)s
    ) AS busy
), claim AS (
    INSERT INTO {table} AS l (
        lock_key, type, code, run_key, status, owner_token, owner, attempt, fencing_token,
        lease_ms, created_at, acquired_at, heartbeat_at, expires_at, finished_at, reason
    )
    SELECT %(lock_key)s, %(type)s, %(code)s, %(run_key)s,
           CASE WHEN overlap.busy THEN 'SKIPPED' ELSE 'RUNNING' END,
           %(owner_token)s, %(owner)s, 1, nextval({fencing_seq_name}), %(lease_ms)s,
           clock_timestamp(), clock_timestamp(), clock_timestamp(),
           clock_timestamp() + %(lease_ms)s * interval '1 millisecond',
           CASE WHEN overlap.busy THEN clock_timestamp() END,
           CASE WHEN overlap.busy THEN 'overlap' END
    FROM overlap
    ON CONFLICT (lock_key) DO UPDATE SET
        status = 'RUNNING',
        owner_token = EXCLUDED.owner_token,
        owner = EXCLUDED.owner,
        attempt = l.attempt + 1,
        fencing_token = EXCLUDED.fencing_token,
        lease_ms = EXCLUDED.lease_ms,
        acquired_at = EXCLUDED.acquired_at,
        heartbeat_at = EXCLUDED.heartbeat_at,
        expires_at = EXCLUDED.expires_at,
        finished_at = NULL,
        retry_at = NULL,
        reason = CASE WHEN l.status = 'RUNNING' THEN 'takeover' ELSE 'retry' END,
        error = NULL
    WHERE (l.status = 'FAIL' AND l.retry_at <= clock_timestamp())
       OR (l.status = 'RUNNING' AND l.expires_at <= clock_timestamp())
    RETURNING l.id, l.status, l.owner, l.attempt, l.fencing_token, l.expires_at,
              l.retry_at, l.reason
)
SELECT true AS claimed, id, status, owner, attempt, fencing_token, expires_at, retry_at,
       reason, clock_timestamp() AS db_now
FROM claim
UNION ALL
SELECT false, e.id, e.status, e.owner, e.attempt, e.fencing_token, e.expires_at, e.retry_at,
       e.reason, clock_timestamp()
FROM {table} e
WHERE e.lock_key = %(lock_key)s AND NOT EXISTS (SELECT 1 FROM claim)

-- name: heartbeat
-- Extend a held lease by the lease it was granted; only the current owner can.
UPDATE {table}
SET heartbeat_at = clock_timestamp(),
    expires_at = clock_timestamp() + lease_ms * interval '1 millisecond'
WHERE id = %(id)s AND owner_token = %(owner_token)s AND status = 'RUNNING'
RETURNING expires_at

-- name: finalize
-- Record SUCCESS or FAIL, by the current owner only. A FAIL row with a retry
-- time can be reclaimed from then on; without one it is final.
UPDATE {table}
SET status = %(status)s,
    finished_at = clock_timestamp(),
    reason = %(reason)s,
    error = left(%(error)s, 4000),
    retry_at = clock_timestamp() + %(retry_ms)s * interval '1 millisecond'
WHERE id = %(id)s AND owner_token = %(owner_token)s AND status = 'RUNNING'
RETURNING id

-- name: migrations_table
CREATE TABLE IF NOT EXISTS {migrations} (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: applied_migrations
SELECT version FROM {migrations} ORDER BY version

-- name: record_migration
INSERT INTO {migrations} (version) VALUES (%(version)s)

-- name: migration_lock
-- Serialise migrations of one table across replicas starting at once.
SELECT pg_advisory_xact_lock(%(lock_id)s)

-- name: advisory_try_lock
-- Open the advisory guard's transaction and try its lock in one round trip
-- (one simple-protocol message, the id bound client-side, nothing prepared, so
-- PgBouncer in transaction pooling pins one server connection for the run).
-- The lock and the timeout overrides last exactly as long as the transaction:
-- a server- or role-wide idle_in_transaction_session_timeout (and, from
-- PostgreSQL 17, transaction_timeout) would otherwise end a long run's lock.
BEGIN;
SELECT set_config('idle_in_transaction_session_timeout', '0', true) AS idle_timeout,
       CASE WHEN current_setting('server_version_num')::int >= 170000
            THEN set_config('transaction_timeout', '0', true) END AS transaction_timeout,
       pg_try_advisory_xact_lock(%(lock_id)s) AS acquired

-- name: advisory_probe
-- The only periodic statement of the advisory guard, and only while a job
-- runs: an answer on the lock's own connection proves the lock still holds.
SELECT 1

-- name: advisory_release
-- End the guard's transaction, which releases its lock; nothing is written.
ROLLBACK

-- name: advisory_lock_id
-- The advisory lock id of a string key (pgcrond hash) computed inside
-- PostgreSQL; equals pgcrond.keys.lock_id(key). Documented in docs/guards.md.
SELECT ('x' || substr(encode(sha256(convert_to('pgcrond:' || %(key)s, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint AS lock_id
