-- Named queries: a "-- name: NAME" line, then the statement. {table}, {migrations}
-- and {fencing_seq_name} are filled in with psycopg.sql; values are always bound.
-- An array is bound in binary (%(name)b): in the text format psycopg quotes and
-- escapes every element in Python, six times the cost (a claim's 13 arrays were
-- 36 us a row on the client, 6 us in binary).
-- A name has one format per statement, comments included (psycopg parses them too).

-- name: forbid_lock
-- Serialise the claims of jobs whose running ticks are counted (a bounded
-- overlap policy: forbid, replace, buffer_one, max_concurrent) across replicas: sent in the
-- same message as the claim, before it, so the claim (a statement of its own in
-- the same implicit transaction) reads a snapshot taken after the lock. One row
-- lock per job (its row inserted on the first claim; DO UPDATE … WHERE false
-- locks the row, even one committed after this statement's snapshot, and
-- writes nothing), none of them in the shared lock table. Codes in ascending
-- order, so two batches never wait on each other in a cycle.
INSERT INTO {forbid_rows} AS f (code)
SELECT DISTINCT code FROM unnest(%(forbid_codes)b::text[]) AS code ORDER BY code
ON CONFLICT (code) DO UPDATE SET code = EXCLUDED.code WHERE false

-- name: claim
-- Claim a batch of identities (co-firing jobs share the round trip) for one
-- owner: insert each, or reclaim a FAIL row whose retry time has come or a
-- RUNNING row whose lease expired (by the database clock, against the expiry
-- stored from the holder's own lease). For each refused claim the current row
-- is returned instead, to say why. Under a bounded overlap policy (the job's
-- running ticks counted under its lock, forbid_lock), while overlap_limit
-- other ticks of the job hold a live lease (busy) a new tick is recorded
-- SKIPPED/overlap and a retry or takeover of an older one is refused; under
-- buffer_one the new tick waits instead, as a FAIL/waiting row due at once
-- that every replica follows and the first claim after the running tick ends
-- starts (a tick that finds one waiting already is SKIPPED/overlap); under
-- replace the new tick marks the running ones replaced (their owners see it
-- at their next heartbeat, stop, and record SKIPPED/replaced; a dead owner's
-- is closed so when its lease lapses), closes an older waiting one
-- SKIPPED/replaced, and waits until the replaced ones stopped. The database clock also
-- decides when a tick is due: a claim before its fire time touches no row and
-- comes back as NOT_DUE (expires_at then carries the fire time, so the caller
-- knows how long to wait); one after its misfire deadline records the tick
-- MISSED/late when it has no row yet (else touches nothing) and comes back LATE.
-- A claim may come up to claim_ahead_ms before its fire time (a replica
-- fires its scheduled ticks that early, so that the round trip is over by the
-- tick): it is won as at the tick, acquired_at, the attempt's start and the
-- lease's count being the fire time, and the caller holds the run until then
-- by the database clock. An early claim that would record SKIPPED (another tick of a forbid
-- job runs, the job is paused) is answered NOT_DUE instead and writes
-- nothing: whether the tick overlaps or is paused is judged at the tick.
-- A first claim answered once the job's next tick has come (superseded_at, sent
-- for jobs with late_ticks: coalesce) records the tick MISSED/coalesced when it
-- has no row yet, or is answered with the row another replica wrote: of
-- several late ticks only the newest runs, judged by the database's clock.
-- A paused job (a row of the job-state table for its code or '*') or a
-- suspended one (suspended: true, sent with the claim) has a new tick recorded
-- SKIPPED with who, when and why, and its retries and takeovers refused
-- (paused says so); a run-once job is refused without a row (PAUSED), so it
-- runs once resumed. Pause is read here, in the claim's own round trip.
-- A tick sent with a skip_reason (calendar:<name>: the job's calendar holds
-- its day) is recorded SKIPPED with that reason, before any pause and at any
-- lateness (it never runs, so it is never MISSED), judged at the tick like a
-- pause; a row the tick has already is answered, never touched.
WITH request AS (
    SELECT *
    FROM unnest(
        %(lock_keys)b::text[], %(types)b::text[], %(codes)b::text[], %(run_keys)b::text[],
        %(owner_tokens)b::uuid[], %(lease_ms)b::bigint[], %(overlap_policies)b::text[],
        %(overlap_limits)b::integer[], %(fire_times)b::timestamptz[],
        %(late_after)b::timestamptz[], %(superseded_at)b::timestamptz[],
        %(pausable)b::boolean[], %(suspended)b::text[], %(skip_reasons)b::text[],
        %(triggers)b::text[]
    ) AS r (lock_key, type, code, run_key, owner_token, lease_ms, overlap_policy,
            overlap_limit, fire_time, late_after, superseded_at, pausable, suspended,
            skip_reason, trigger)
), mine AS MATERIALIZED (
    -- The existing rows, locked without waiting: a row another transaction
    -- holds (an sql: job's own, while its statements run) is refused as held
    -- by its owner and never waited for, so it stalls no other claim of the
    -- statement. Only absent or locked-here rows go to the INSERT below.
    SELECT e.lock_key FROM {table} e JOIN request r ON r.lock_key = e.lock_key
    ORDER BY e.lock_key
    FOR UPDATE OF e SKIP LOCKED
), due AS (
    SELECT r.*,
           r.skip_reason IS NULL AND r.type = 'SCHEDULE' AND r.fire_time <= clock_timestamp()
             AND (r.late_after IS NULL OR clock_timestamp() <= r.late_after)
             AND clock_timestamp() >= r.superseded_at AS coalesced
    FROM request r
), checked AS (
    SELECT r.*, EXISTS (
        SELECT 1 FROM {table} e
        WHERE e.lock_key = r.lock_key AND e.lock_key NOT IN (SELECT lock_key FROM mine)
    ) AS locked,
    -- The job's slots: its other ticks with a live lease (a replaced one
    -- still stopping counts: its owner has not reported the stop).
    CASE WHEN r.overlap_limit IS NULL THEN false ELSE r.overlap_limit <= (
        SELECT count(*) FROM {table} o
        WHERE o.code = r.code AND o.type = 'SCHEDULE'
          AND o.status = 'RUNNING' AND o.expires_at > clock_timestamp()
          AND o.lock_key <> r.lock_key
    ) END AS busy,
    -- Another tick of the job waits for a slot (buffer_one, replace).
    CASE WHEN r.overlap_policy IN ('buffer_one', 'replace') THEN EXISTS (
        SELECT 1 FROM {table} w
        WHERE w.code = r.code AND w.status = 'FAIL' AND w.reason = 'waiting'
          AND w.lock_key <> r.lock_key
    ) ELSE false END AS queued,
    -- This tick's own row: none, or a waiting one, is a first start; a
    -- replaced tick whose owner's lease lapsed is closed, never taken over.
    r.type = 'SCHEDULE' AND (own.status IS NULL
                             OR (own.status = 'FAIL' AND own.reason IS NOT DISTINCT FROM 'waiting'))
      AS first_start,
    own.status IS NULL AS unrecorded,
    own.status IS NOT DISTINCT FROM 'RUNNING' AND own.reason IS NOT DISTINCT FROM 'replaced'
      AS stopping,
    (r.fire_time IS NULL
       OR r.fire_time <= clock_timestamp() + %(claim_ahead_ms)s * interval '1 millisecond')
      AND (r.skip_reason IS NOT NULL OR r.late_after IS NULL OR clock_timestamp() <= r.late_after)
      AND r.coalesced IS NOT TRUE AS due_now,
    r.skip_reason IS NULL AND r.type = 'SCHEDULE' AND r.fire_time <= clock_timestamp()
      AND (clock_timestamp() > r.late_after OR r.coalesced IS TRUE) AS missed,
    r.fire_time IS NOT NULL AND r.fire_time > clock_timestamp() AS early,
    CASE WHEN r.skip_reason IS NOT NULL THEN r.skip_reason
         WHEN r.suspended IS NOT NULL THEN 'suspended'
         WHEN p.code IS NOT NULL THEN 'paused' END AS pause_reason,
    CASE WHEN r.skip_reason IS NOT NULL THEN NULL
         WHEN r.suspended IS NOT NULL THEN r.suspended
         WHEN p.code IS NOT NULL THEN
             'paused by ' || p.paused_by || ' at '
             || to_char(p.paused_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
             || coalesce(': ' || p.reason, '') END AS pause_detail
    FROM due r
    LEFT JOIN {table} own ON own.lock_key = r.lock_key
    -- The primary key holds at most two rows here: the job's and '*'.
    LEFT JOIN LATERAL (
        SELECT s.code, s.paused_by, s.paused_at, s.reason
        FROM {job_state} s
        WHERE r.pausable AND s.code IN (r.code, '*')
        ORDER BY s.code = r.code DESC
        LIMIT 1
    ) p ON true
), decided AS MATERIALIZED (
    -- Each clock reading above made once per row: the answer below agrees
    -- with the claim about whether the tick was early, due or late.
    SELECT c.*,
           c.due_now AND NOT (c.early AND (c.busy OR c.queued OR c.pause_reason IS NOT NULL))
             AS timely,
           -- The overlap policy's answer for a first start while the job's
           -- slots are taken, or another tick waits: wait, or be skipped.
           c.first_start AND c.busy
             AND (c.overlap_policy = 'replace' OR (c.overlap_policy = 'buffer_one' AND NOT c.queued))
             AS waits,
           c.overlap_policy = 'buffer_one' AND c.unrecorded AND c.queued AS behind,
           c.overlap_policy = 'replace' AND c.first_start AND (c.busy OR c.queued) AS replaces
    FROM checked c
), fence AS MATERIALIZED (
    -- concurrency: replace: the running ticks the new one replaces (those
    -- started before it), marked so that their owners' next heartbeats stop
    -- them. A row another transaction holds just now (its heartbeat, its
    -- finalize) is not waited for: the waiting tick's next claim marks it.
    SELECT o.id, c.run_key AS replaced_by
    FROM decided c
    JOIN {table} o ON o.code = c.code AND o.type = 'SCHEDULE' AND o.status = 'RUNNING'
    WHERE c.replaces AND c.timely AND NOT c.locked AND c.missed IS NOT TRUE
      AND c.pause_reason IS NULL
      AND o.lock_key <> c.lock_key AND o.expires_at > clock_timestamp()
      AND o.reason IS DISTINCT FROM 'replaced'
      AND o.acquired_at <= coalesce(c.fire_time, clock_timestamp())
    ORDER BY o.lock_key
    FOR UPDATE OF o SKIP LOCKED
), fenced AS (
    UPDATE {table} AS o
    SET reason = 'replaced',
        error = 'replaced by the tick ' || f.replaced_by
                || ' (concurrency: replace): stopped at its owner''s next heartbeat'
    FROM fence f
    WHERE o.id = f.id
), unqueued AS (
    -- concurrency: replace: an older tick still waiting is replaced before it started.
    UPDATE {table} AS w
    SET status = 'SKIPPED', reason = 'replaced', retry_at = NULL,
        finished_at = clock_timestamp(), expires_at = clock_timestamp(),
        error = 'replaced before it started by the tick ' || c.run_key || ' (concurrency: replace)'
    FROM decided c
    WHERE c.replaces AND c.timely AND NOT c.locked AND c.missed IS NOT TRUE
      AND c.pause_reason IS NULL
      AND w.code = c.code AND w.status = 'FAIL' AND w.reason = 'waiting'
      AND w.lock_key <> c.lock_key
), claim AS (
    INSERT INTO {table} AS l (
        lock_key, type, code, run_key, status, owner_token, owner, attempt, fencing_token,
        lease_ms, created_at, acquired_at, heartbeat_at, expires_at, finished_at, retry_at,
        reason, error
    )
    SELECT c.lock_key, c.type, c.code, c.run_key,
           CASE WHEN c.missed THEN 'MISSED'
                WHEN c.pause_reason IS NOT NULL OR c.stopping THEN 'SKIPPED'
                WHEN c.waits THEN 'FAIL'
                WHEN c.busy OR c.behind THEN 'SKIPPED'
                ELSE 'RUNNING' END,
           -- No attempt was made of a missed or skipped (calendar) tick; a
           -- waiting tick has made none yet: its start counts the first.
           c.owner_token, %(owner)s,
           CASE WHEN c.missed OR c.skip_reason IS NOT NULL OR c.waits THEN 0 ELSE 1 END,
           nextval({fencing_seq_name}), c.lease_ms,
           clock_timestamp(),
           -- A MISSED row was never acquired: it sorts at its tick. An early
           -- claim's run starts at its fire time.
           CASE WHEN c.missed THEN c.fire_time ELSE greatest(clock_timestamp(), c.fire_time) END,
           clock_timestamp(),
           -- A lease counts from the later of the claim and the fire time: a
           -- claim won ahead never shortens its run's lease.
           CASE WHEN c.missed OR c.pause_reason IS NOT NULL OR c.busy OR c.behind
                     OR c.stopping THEN clock_timestamp()
                ELSE greatest(clock_timestamp(), c.fire_time)
                     + c.lease_ms * interval '1 millisecond' END,
           CASE WHEN c.missed OR c.pause_reason IS NOT NULL OR c.stopping THEN clock_timestamp()
                WHEN c.waits THEN NULL
                WHEN c.busy OR c.behind THEN clock_timestamp() END,
           CASE WHEN c.waits AND c.missed IS NOT TRUE AND c.pause_reason IS NULL
                THEN clock_timestamp() END,
           CASE WHEN c.coalesced THEN 'coalesced' WHEN c.missed THEN 'late'
                WHEN c.pause_reason IS NOT NULL THEN c.pause_reason
                WHEN c.stopping THEN 'replaced'
                WHEN c.waits THEN 'waiting'
                WHEN c.busy OR c.behind THEN 'overlap' END,
           CASE WHEN c.coalesced THEN
                    'coalesced: ' || %(owner)s || ' claimed it '
                    || date_trunc('milliseconds', clock_timestamp() - c.fire_time)
                    || ' after the tick, when the next tick (due '
                    || to_char(c.superseded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                    || ') had come; late_ticks: coalesce runs the newest of late ticks only'
                WHEN c.missed THEN
                    'replica too late: ' || %(owner)s || ' claimed it '
                    || date_trunc('milliseconds', clock_timestamp() - c.fire_time)
                    || ' after the tick, past misfire_grace '
                    || (c.late_after - c.fire_time)
                WHEN c.pause_reason IS NOT NULL THEN c.pause_detail
                WHEN c.waits THEN
                    'waits for the running tick of the job to end (concurrency: '
                    || c.overlap_policy || ')'
                WHEN c.behind THEN
                    'another tick of the job waits already (concurrency: buffer_one)' END
    FROM decided c
    WHERE ((c.timely AND NOT (c.pause_reason IS NOT NULL AND c.type = 'INITIAL')) OR c.missed)
      AND NOT c.locked
    -- One insertion order on every replica, so two batches never wait on each
    -- other's uncommitted keys in a cycle.
    ORDER BY c.lock_key
    ON CONFLICT (lock_key) DO UPDATE SET
        status = EXCLUDED.status,
        owner_token = EXCLUDED.owner_token,
        owner = EXCLUDED.owner,
        attempt = CASE WHEN EXCLUDED.status = 'RUNNING' THEN l.attempt + 1 ELSE l.attempt END,
        fencing_token = EXCLUDED.fencing_token,
        lease_ms = EXCLUDED.lease_ms,
        acquired_at = EXCLUDED.acquired_at,
        heartbeat_at = EXCLUDED.heartbeat_at,
        expires_at = EXCLUDED.expires_at,
        finished_at = EXCLUDED.finished_at,
        retry_at = NULL,
        -- A waiting tick's start is its first: neither a retry nor a takeover.
        reason = CASE WHEN EXCLUDED.status = 'SKIPPED' THEN EXCLUDED.reason
                      WHEN l.status = 'RUNNING' THEN 'takeover'
                      WHEN l.reason = 'waiting' THEN NULL ELSE 'retry' END,
        error = CASE WHEN EXCLUDED.reason = 'replaced' THEN l.error
                     WHEN EXCLUDED.status = 'SKIPPED' THEN
                    'its owner ' || l.owner || ' stopped and a newer tick of the job runs: '
                    || 'not taken over (its overlap policy)' END
    WHERE ((l.status = 'FAIL' AND l.retry_at <= clock_timestamp())
           OR (l.status = 'RUNNING' AND l.expires_at <= clock_timestamp()))
      -- EXCLUDED.status is RUNNING exactly when the job has a free slot, no
      -- tick waits ahead of it, the job is not paused and the claim is
      -- inside its window. A dead owner's tick that a newer running tick
      -- makes an overlap, or that was replaced, is closed SKIPPED (fenced),
      -- rather than left RUNNING for nobody to finish.
      AND (EXCLUDED.status = 'RUNNING'
           OR (EXCLUDED.status = 'SKIPPED' AND EXCLUDED.reason IN ('overlap', 'replaced')
               AND l.status = 'RUNNING'))
    RETURNING l.lock_key, l.id, l.status, l.owner, l.owner_token, l.attempt, l.fencing_token,
              l.expires_at, l.retry_at, l.reason, l.error, l.acquired_at
), started AS (
    -- Every won claim starts an attempt record (closed by its finalize), in
    -- this round trip: a replica killed mid-attempt leaves one that says so.
    -- Its trigger kind: what the fire asked for, unless the won row makes it a
    -- takeover or a retry (the rule of pgcrond.core.trigger.attempt_trigger,
    -- which tells the job the same).
    INSERT INTO {attempts} AS a (
        lease_id, fencing_token, attempt, replica, started_at, status, trigger
    )
    SELECT c.id, c.fencing_token, c.attempt, c.owner, c.acquired_at, 'running',
           CASE WHEN c.reason = 'takeover' THEN 'takeover'
                WHEN c.reason = 'retry' AND r.trigger IN ('schedule', 'catch_up') THEN 'retry'
                ELSE r.trigger END
    FROM claim c
    JOIN request r ON r.lock_key = c.lock_key
    WHERE c.status = 'RUNNING'
), superseded AS (
    -- A reclaimed row's attempt still 'running' had an owner that never
    -- finished it (killed, cut off, released by unlock): closed as lost.
    UPDATE {attempts} AS a
    SET status = 'lost',
        finished_at = clock_timestamp(),
        error = CASE WHEN c.status = 'RUNNING' THEN
                    'lost: its replica stopped renewing the lease before the attempt ended; '
                    || c.owner || ' took the tick over (attempt ' || c.attempt || ')'
                WHEN c.reason = 'replaced' THEN
                    'lost: replaced by a newer tick (concurrency: replace), and its replica '
                    || 'stopped renewing the lease before it reported the stop'
                ELSE
                    'lost: its replica stopped renewing the lease before the attempt ended; '
                    || 'not taken over (its overlap policy)' END
    FROM claim c
    WHERE a.lease_id = c.id AND a.status = 'running' AND a.fencing_token < c.fencing_token
)
-- A claimed row that is FAIL waits for the job's slot (busy).
SELECT true AS claimed, lock_key, id, status, owner, owner_token, attempt, fencing_token,
       expires_at, retry_at, reason, status = 'FAIL' AS busy, NULL::text AS paused, error AS detail,
       false AS locked, clock_timestamp() AS db_now
FROM claim
UNION ALL
SELECT false, e.lock_key, e.id, e.status, e.owner, e.owner_token, e.attempt, e.fencing_token,
       e.expires_at, e.retry_at, e.reason, c.busy, c.pause_reason, c.pause_detail, c.locked,
       clock_timestamp()
FROM {table} e
JOIN decided c ON c.lock_key = e.lock_key
-- A coalesced tick that has a row is answered with it: another replica ran it.
WHERE (c.timely OR c.coalesced) AND NOT EXISTS (SELECT 1 FROM claim l WHERE l.lock_key = e.lock_key)
UNION ALL
SELECT false, c.lock_key, NULL,
       CASE WHEN c.timely THEN 'PAUSED' WHEN c.early THEN 'NOT_DUE'
            ELSE 'LATE' END,
       NULL, NULL, NULL, NULL, c.fire_time, NULL, NULL, false, c.pause_reason, c.pause_detail,
       false, clock_timestamp()
FROM decided c
WHERE NOT EXISTS (SELECT 1 FROM claim l WHERE l.lock_key = c.lock_key)
  AND c.coalesced IS NOT TRUE
  AND (NOT c.timely
       OR (c.pause_reason IS NOT NULL AND c.type = 'INITIAL'
           AND NOT EXISTS (SELECT 1 FROM {table} e WHERE e.lock_key = c.lock_key)))

-- name: standings
-- Where each of these ticks stands, for a replica that left them to the one
-- preferred for them (spread): settled (SUCCESS, MISSED, SKIPPED, or FAIL
-- with no retry time: rows no claim ever takes again, by the claim's own
-- rule above), or how long until a claim could take the row (a RUNNING row's
-- expiry, a FAIL row's retry time; 0 or less: now). A tick with no row is not
-- returned. Read only: no lock, no write.
SELECT lock_key, status,
       status NOT IN ('RUNNING', 'FAIL') OR (status = 'FAIL' AND retry_at IS NULL) AS settled,
       extract(epoch FROM CASE WHEN status = 'RUNNING' THEN expires_at ELSE retry_at END
                          - clock_timestamp()) AS wait_s
FROM {table}
WHERE lock_key = ANY(%(lock_keys)b::text[])

-- name: heartbeat
-- Extend held leases by the lease each was granted, from the later of now and
-- acquired_at (a lease won ahead counts from its fire time: a beat before the
-- tick never shortens it). Only each row's current owner can, only while it is
-- live (a late beat must not revive a stopped run's lease); revive: the
-- owner's wake check after a stall (storage/keepalive.py) may, if unclaimed.
-- Rows lock in lock-key order, the claim's, so batches never wait in a cycle.
-- A row another transaction holds (an sql: job's own) is not waited for: it
-- is answered live, not renewed, with the expiry it has, which holds (no claim
-- takes a locked row; the sql: job's statement timeout ends inside its lease).
-- A lease a newer tick replaced (concurrency: replace) is not renewed: it is
-- answered replaced; its owner stops the run and records SKIPPED/replaced.
WITH beat AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(owner_tokens)b::uuid[]) AS h (id, owner_token)
), mine AS MATERIALIZED (
    SELECT l.id FROM {table} l JOIN beat h ON l.id = h.id AND l.owner_token = h.owner_token
    ORDER BY l.lock_key
    FOR UPDATE OF l SKIP LOCKED
), renewed AS (
    UPDATE {table} AS l
    SET heartbeat_at = clock_timestamp(),
        expires_at = greatest(clock_timestamp(), l.acquired_at)
                     + l.lease_ms * interval '1 millisecond'
    FROM mine
    WHERE l.id = mine.id AND l.status = 'RUNNING'
      AND l.reason IS DISTINCT FROM 'replaced'
      AND (l.expires_at > clock_timestamp() OR %(revive)s::boolean)
    RETURNING l.id, l.expires_at
)
SELECT id, expires_at, clock_timestamp() AS db_now, false AS replaced FROM renewed
UNION ALL
SELECT l.id, l.expires_at, clock_timestamp(), l.reason IS NOT DISTINCT FROM 'replaced'
FROM {table} l JOIN beat h ON l.id = h.id AND l.owner_token = h.owner_token
WHERE l.status = 'RUNNING'
  AND ((l.expires_at > clock_timestamp() AND l.id NOT IN (SELECT id FROM mine))
       OR l.reason IS NOT DISTINCT FROM 'replaced')

-- name: finalize
-- Record SUCCESS or FAIL for a batch of runs (co-finishing runs share the
-- statement), each row by its current owner only. A FAIL row with a retry time
-- can be reclaimed from then on; without one it is final. Repeating the same
-- finalize (its reply was lost in an outage) succeeds again: the owner token
-- only changes on a claim, so this stays fenced. Locked in lock-key order.
-- Each recorded outcome closes its attempt record too (the claim's fencing
-- token names it), with the exit code, duration and output the run left.
-- SKIPPED/replaced is the stop of a replaced run (concurrency: replace): only
-- for a row a newer tick marked replaced, whose text (naming that tick) stays.
WITH outcome AS (
    SELECT *
    FROM unnest(
        %(ids)b::bigint[], %(owner_tokens)b::uuid[], %(statuses)b::text[],
        %(reasons)b::text[], %(errors)b::text[], %(retry_ms)b::bigint[],
        %(fencing_tokens)b::bigint[], %(exit_codes)b::integer[], %(durations_ms)b::float8[],
        %(stdout_heads)b::bytea[], %(stdout_tails)b::bytea[], %(stdout_dropped)b::bigint[],
        %(stderr_heads)b::bytea[], %(stderr_tails)b::bytea[], %(stderr_dropped)b::bigint[]
    ) AS f (id, owner_token, status, reason, error, retry_ms, fencing_token, exit_code,
            duration_ms, stdout_head, stdout_tail, stdout_dropped, stderr_head, stderr_tail,
            stderr_dropped)
), mine AS (
    SELECT l.id FROM {table} l JOIN outcome f ON l.id = f.id AND l.owner_token = f.owner_token
    ORDER BY l.lock_key
    FOR UPDATE OF l
), recorded AS (
    UPDATE {table} AS l
    SET status = f.status,
        finished_at = clock_timestamp(),
        reason = f.reason,
        error = CASE WHEN f.reason = 'replaced' THEN l.error ELSE left(f.error, 4000) END,
        retry_at = clock_timestamp() + f.retry_ms * interval '1 millisecond'
    FROM outcome f
    WHERE l.id = f.id AND l.id IN (SELECT id FROM mine)
      AND (l.status = 'RUNNING' OR (l.status = f.status AND l.finished_at IS NOT NULL))
      AND (f.reason IS DISTINCT FROM 'replaced' OR l.reason = 'replaced')
    RETURNING l.id
), closed AS (
    UPDATE {attempts} AS a
    SET status = CASE WHEN f.status = 'SUCCESS' THEN 'success'
                      WHEN f.reason IN ('timeout', 'released', 'replaced') THEN f.reason
                      ELSE 'fail' END,
        finished_at = coalesce(a.finished_at, clock_timestamp()),
        error = left(f.error, 4000),
        exit_code = f.exit_code,
        duration_ms = f.duration_ms,
        stdout_head = f.stdout_head, stdout_tail = f.stdout_tail,
        stdout_dropped = f.stdout_dropped,
        stderr_head = f.stderr_head, stderr_tail = f.stderr_tail,
        stderr_dropped = f.stderr_dropped
    FROM outcome f
    WHERE a.lease_id = f.id AND a.fencing_token = f.fencing_token
      AND f.id IN (SELECT id FROM recorded)
)
SELECT id FROM recorded

-- name: give_back
-- Give back a won claim that ran nothing, because its answer came too slowly
-- to tell whether the tick is still inside its window. The database clock
-- decides: past late_after the row is closed FAIL/late for good (nobody may run
-- it); inside, it is FAIL/released, reclaimable at once, and the attempt it
-- counted is taken back (the next claim counts it again), so a give-back never
-- costs the job a retry. By the current owner only. The attempt record the
-- claim started goes too: no attempt ran.
WITH given AS (
UPDATE {table}
SET status = 'FAIL',
    finished_at = clock_timestamp(),
    reason = CASE WHEN clock_timestamp() > %(late_after)s THEN 'late' ELSE 'released' END,
    error = CASE WHEN clock_timestamp() > %(late_after)s
                 THEN 'the claim was answered after the tick''s misfire window'
                 ELSE 'given back unrun: its answer came too slowly to judge the window' END,
    retry_at = CASE WHEN clock_timestamp() > %(late_after)s THEN NULL ELSE clock_timestamp() END,
    attempt = CASE WHEN clock_timestamp() > %(late_after)s THEN attempt ELSE attempt - 1 END
WHERE id = %(id)s AND owner_token = %(owner_token)s AND status = 'RUNNING'
RETURNING id, reason, fencing_token
), unrun AS (
    DELETE FROM {attempts} a USING given g
    WHERE a.lease_id = g.id AND a.fencing_token = g.fencing_token
)
SELECT id, reason FROM given

-- name: schema_exists
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s) AS present

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

-- name: table_exists
-- Whether the lease table was created, so the CLI can say "run pgcrond migrate"
-- instead of relaying a driver error.
SELECT to_regclass(%(name)s) IS NOT NULL AS present

-- name: job_status
-- One row per job code: its last finished run (a skip is not a run), its live or
-- stale RUNNING row, and its FAIL rows since the last SUCCESS. Laterals use the
-- (code, acquired_at) index, so the cost grows with jobs, not with history.
WITH jobs AS (
    SELECT code FROM unnest(%(codes)b::text[]) AS code
)
SELECT jobs.code,
       last.type AS last_type, last.run_key AS last_run_key, last.status AS last_status,
       last.reason AS last_reason, last.attempt AS last_attempt, last.owner AS last_owner,
       last.acquired_at AS last_acquired_at, last.finished_at AS last_finished_at,
       last.retry_at AS last_retry_at, last.error AS last_error,
       running.run_key AS running_run_key, running.owner AS running_owner,
       running.attempt AS running_attempt, running.acquired_at AS running_acquired_at,
       running.expires_at AS running_expires_at,
       running.expires_at <= clock_timestamp() AS running_stale,
       failures.count AS consecutive_failures
FROM jobs
LEFT JOIN LATERAL (
    SELECT l.type, l.run_key, l.status, l.reason, l.attempt, l.owner, l.acquired_at,
           l.finished_at, l.retry_at, l.error
    FROM {table} l
    WHERE l.code = jobs.code AND l.status IN ('SUCCESS', 'FAIL')
      AND coalesce(l.reason, '') NOT IN ('waiting', 'backfill')
    ORDER BY l.acquired_at DESC, l.id DESC
    LIMIT 1
) last ON true
LEFT JOIN LATERAL (
    SELECT r.run_key, r.owner, r.attempt, r.acquired_at, r.expires_at
    FROM {table} r
    WHERE r.code = jobs.code AND r.status = 'RUNNING'
    ORDER BY r.acquired_at DESC, r.id DESC
    LIMIT 1
) running ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS count
    FROM {table} f
    WHERE f.code = jobs.code AND f.status = 'FAIL'
      AND coalesce(f.reason, '') NOT IN ('waiting', 'backfill')
      AND f.acquired_at > coalesce(
          (SELECT max(s.acquired_at) FROM {table} s
           WHERE s.code = jobs.code AND s.status = 'SUCCESS'),
          '-infinity')
) failures ON true
ORDER BY array_position(%(codes)b::text[], jobs.code)

-- name: history
-- Past runs, newest first; every filter is optional (NULL = any). Without
-- %(internal)s, pgcrond's own rows (codes 'pgcrond:...') are left out. A run
-- that a request asked for shows the request's parameters (its unique key).
SELECT l.id, l.type, l.code, l.run_key, l.status, l.reason, l.attempt, l.owner,
       l.fencing_token, l.acquired_at, l.finished_at, l.expires_at, l.retry_at, l.error,
       r.params
FROM {table} l
LEFT JOIN {requests} r ON r.code = l.code AND r.run_key = l.run_key
WHERE (%(code)s::text IS NULL OR l.code = %(code)s)
  AND (%(internal)s OR l.code NOT LIKE 'pgcrond:%%')
  AND (%(since)s::timestamptz IS NULL OR l.acquired_at >= %(since)s)
  AND (%(status)s::text IS NULL OR l.status = %(status)s)
ORDER BY l.acquired_at DESC, l.id DESC
LIMIT %(limit)s

-- name: unlock_show
-- The row `pgcrond unlock` is about to change, as the operator will see it.
SELECT id, type, code, run_key, status, reason, attempt, owner, owner_token, fencing_token,
       acquired_at, finished_at, expires_at, retry_at, error,
       expires_at <= clock_timestamp() AS stale
FROM {table}
WHERE lock_key = %(lock_key)s AND code = %(code)s

-- name: unlock_release
-- Release one row: FAIL/released, reclaimable now. The new owner token fences the
-- old owner (its heartbeat and finalize match no row). Guarded by the status and
-- token that were shown, so a row that moved on meanwhile is left alone.
-- An attempt still running by the record is closed as lost: its owner is fenced.
WITH released AS (
    UPDATE {table}
    SET status = 'FAIL',
        reason = 'released',
        owner_token = gen_random_uuid(),
        finished_at = clock.now,
        retry_at = clock.now,
        error = left(%(error)s, 4000)
    FROM (SELECT clock_timestamp() AS now) clock
    WHERE lock_key = %(lock_key)s AND code = %(code)s
      AND status = %(status)s AND owner_token = %(owner_token)s
    RETURNING id, error
), lost AS (
    UPDATE {attempts} AS a
    SET status = 'lost', finished_at = clock_timestamp(), error = 'lost: ' || r.error
    FROM released r
    WHERE a.lease_id = r.id AND a.status = 'running'
)
SELECT id FROM released

-- name: prune_batch
-- Delete one batch of finished SCHEDULE rows older than the cutoff. SKIP LOCKED:
-- a row a claim is reclaiming right now is left for the next prune. INITIAL rows
-- are never pruned: they are what makes a run-once job run once. Only the jobs
-- %(only_codes)b (NULL: all) but %(except_codes)b: jobs with a retention of their own.
DELETE FROM {table}
WHERE id IN (
    SELECT id FROM {table}
    WHERE type = 'SCHEDULE' AND status <> 'RUNNING'
      AND finished_at < clock_timestamp() - %(older_than_ms)s * interval '1 millisecond'
      AND (%(only_codes)b::text[] IS NULL OR code = ANY(%(only_codes)b::text[]))
      AND NOT (code = ANY(%(except_codes)b::text[]))
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)

-- name: abandon_stale
-- Mark SCHEDULE rows still RUNNING long after their lease expired as
-- FAIL/abandoned (final): their owner vanished and nobody took the tick over
-- within its misfire window, and ticks never repeat, so nothing else would
-- ever close them. The new owner token fences the vanished owner, should it
-- come back. (A run-once row needs none of this: every start reclaims it.)
-- Its attempt record is closed as lost.
WITH abandoned AS (
    UPDATE {table}
    SET status = 'FAIL',
        reason = 'abandoned',
        owner_token = gen_random_uuid(),
        finished_at = clock_timestamp(),
        retry_at = NULL,
        error = 'abandoned: the lease expired at ' || expires_at || ' and nobody took the tick over'
    WHERE type = 'SCHEDULE' AND status = 'RUNNING'
      AND expires_at < clock_timestamp() - %(after_ms)s * interval '1 millisecond'
    RETURNING id, error
), lost AS (
    UPDATE {attempts} AS a
    SET status = 'lost', finished_at = clock_timestamp(), error = 'lost: ' || b.error
    FROM abandoned b
    WHERE a.lease_id = b.id AND a.status = 'running'
)
SELECT id FROM abandoned

-- name: open_ticks
-- Ticks of these jobs that are not finished: RUNNING (a takeover may still be
-- due) or FAIL with a retry time (a retry is due or pending). A replica that
-- starts follows them, so a tick whose last owner died is not left to chance.
-- Uses the partial running index and the (code, acquired_at) index; bounded.
SELECT code, run_key, status, reason, retry_at, expires_at, key_code
FROM {table}
WHERE type = 'SCHEDULE' AND code = ANY(%(codes)b::text[])
  AND (status = 'RUNNING' OR (status = 'FAIL' AND retry_at IS NOT NULL))
  AND acquired_at > clock_timestamp() - %(within_ms)s * interval '1 millisecond'
ORDER BY acquired_at
LIMIT %(limit)s

-- name: pause_jobs
-- Pause jobs cluster-wide (code '*' is every job): the claim reads these rows.
-- Pausing again keeps the first pause's who and when, and takes the new reason.
INSERT INTO {job_state} AS s (code, paused_by, paused_at, reason)
SELECT code, %(by)s, clock_timestamp(), %(reason)s
FROM unnest(%(codes)b::text[]) AS code
ON CONFLICT (code) DO UPDATE SET reason = coalesce(EXCLUDED.reason, s.reason)
RETURNING code, paused_by, paused_at, reason

-- name: resume_jobs
-- Resume jobs: their rows go (with all_jobs, every row, '*' included), and the
-- replicas are woken (resumed channel) when any did: a takeover, retry or
-- run-once job that waits for the resume claims again at once.
WITH resumed AS (
    DELETE FROM {job_state}
    WHERE %(all_jobs)s OR code = ANY(%(codes)b::text[])
    RETURNING code
), woken AS (
    SELECT pg_notify(%(channel)s, '') FROM (SELECT 1 FROM resumed LIMIT 1) any_resumed
)
SELECT code FROM resumed CROSS JOIN (SELECT count(*) FROM woken) notified

-- name: paused_jobs
-- Every pause in force, for status, the metric and the daemon's start.
SELECT code, paused_by, paused_at, reason FROM {job_state} ORDER BY code

-- name: last_ticks
-- Per job, the newest tick that has a row (any status), from the job's newest
-- rows by the (code, acquired_at) index: a starting replica computes the
-- expected ticks after it. Manual run keys are not ticks. Bounded: jobs x 20 rows.
-- %(before)s (database clock, or NULL): rows acquired from then on are left
-- out, so a tick claimed since the replica started cannot hide the gap before it.
-- db_now: the database's clock, which decides what is missed (a replica's own
-- may run ahead); one row with a NULL code when no code is given.
WITH now AS (
    SELECT clock_timestamp() AS db_now
), jobs AS (
    SELECT code FROM unnest(%(codes)b::text[]) AS code
)
SELECT now.db_now, jobs.code, newest.run_key AS last_run_key
FROM now
LEFT JOIN jobs ON true
LEFT JOIN LATERAL (
    SELECT max(t.run_key) AS run_key
    FROM (
        SELECT l.run_key
        FROM {table} l
        WHERE l.code = jobs.code AND l.type = 'SCHEDULE' AND l.run_key NOT LIKE 'manual:%%'
          AND l.acquired_at > clock_timestamp() - %(within_ms)s * interval '1 millisecond'
          AND (%(before)s::timestamptz IS NULL OR l.acquired_at < %(before)s::timestamptz)
        ORDER BY l.acquired_at DESC
        LIMIT 20
    ) t
) newest ON true

-- name: record_missed
-- Record ticks MISSED (or SKIPPED: a calendar's day), each with its status,
-- reason and why; a tick that has a row
-- (it ran, runs, or was recorded already) is left alone, so any replica may
-- record the same tick and the first record stands. Only a tick whose misfire
-- deadline (tick + %(grace_ms)b) is past by the database's clock: a replica
-- whose clock runs ahead must not close a tick that every replica may still
-- claim. In lock-key order, like the claim, so it never deadlocks with one. A
-- MISSED row was never acquired: acquired_at is its tick, so history sorts it
-- where it belongs.
INSERT INTO {table} (
    lock_key, type, code, run_key, status, owner_token, owner, attempt, fencing_token,
    lease_ms, created_at, acquired_at, heartbeat_at, expires_at, finished_at, reason, error
)
SELECT m.lock_key, 'SCHEDULE', m.code, m.run_key, m.status, gen_random_uuid(), %(owner)s, 0,
       nextval({fencing_seq_name}), 1000, clock_timestamp(), m.fire_time, clock_timestamp(),
       clock_timestamp(), clock_timestamp(), m.reason, left(m.error, 4000)
FROM unnest(
    %(lock_keys)b::text[], %(codes)b::text[], %(run_keys)b::text[],
    %(fire_times)b::timestamptz[], %(grace_ms)b::bigint[], %(statuses)b::text[],
    %(reasons)b::text[], %(errors)b::text[]
) AS m (lock_key, code, run_key, fire_time, grace_ms, status, reason, error)
WHERE m.fire_time + m.grace_ms * interval '1 millisecond' < clock_timestamp()
ORDER BY m.lock_key
ON CONFLICT (lock_key) DO NOTHING
RETURNING code, run_key

-- name: running_scan
-- The live lease of a tick of one code (the catch-up scan's), if any, and how
-- long until it could lapse by the database's clock: a scan reads it before
-- claiming, so that waiting for another replica's scan writes no row.
SELECT owner, expires_at - clock_timestamp() AS remaining
FROM {table}
WHERE code = %(code)s AND type = 'SCHEDULE' AND status = 'RUNNING'
  AND expires_at > clock_timestamp()
ORDER BY expires_at DESC
LIMIT 1

-- name: job_ticks
-- Per job, for status and the alert gauges: the newest tick with a row, the
-- newest SUCCESS and FAIL (with the failures since that SUCCESS), and the
-- MISSED ticks of the last %(misses_within_ms)s. Each lateral walks the
-- (code, acquired_at) index and stops at its LIMIT, or counts a bounded range.
WITH jobs AS (
    SELECT code, ord FROM unnest(%(codes)b::text[]) WITH ORDINALITY AS j (code, ord)
)
SELECT jobs.code,
       tick.run_key AS last_tick, tick.status AS last_tick_status,
       tick.reason AS last_tick_reason,
       ok.finished_at AS last_success_at, ok.run_key AS last_success_run_key,
       bad.finished_at AS last_failure_at, bad.run_key AS last_failure_run_key,
       (SELECT count(*) FROM {table} f
        WHERE f.code = jobs.code AND f.status = 'FAIL' AND f.retry_at IS NULL
          AND f.acquired_at > coalesce(ok.acquired_at, '-infinity')) AS consecutive_failures,
       (SELECT count(*) FROM {table} m
        WHERE m.code = jobs.code AND m.status = 'MISSED'
          AND m.acquired_at > clock_timestamp() - %(misses_within_ms)s * interval '1 millisecond'
       ) AS recent_misses
FROM jobs
LEFT JOIN LATERAL (
    SELECT t.run_key, t.status, t.reason FROM {table} t
    WHERE t.code = jobs.code AND t.type = 'SCHEDULE' AND t.run_key NOT LIKE 'manual:%%'
    ORDER BY t.acquired_at DESC, t.id DESC LIMIT 1
) tick ON true
LEFT JOIN LATERAL (
    SELECT s.run_key, s.acquired_at, s.finished_at FROM {table} s
    WHERE s.code = jobs.code AND s.status = 'SUCCESS'
    ORDER BY s.acquired_at DESC, s.id DESC LIMIT 1
) ok ON true
LEFT JOIN LATERAL (
    SELECT b.run_key, b.finished_at FROM {table} b
    WHERE b.code = jobs.code AND b.status = 'FAIL' AND b.reason NOT IN ('released', 'waiting', 'backfill')
    ORDER BY b.acquired_at DESC, b.id DESC LIMIT 1
) bad ON true
ORDER BY jobs.ord

-- name: ping
-- Readiness: the database answers.
SELECT 1 AS ok

-- name: database_now
-- The database's clock: the moment a starting replica's scan looks before.
SELECT clock_timestamp() AS now

-- name: status_page_jobs
-- The status page's jobs view, one row per code, in the order given: the job's
-- newest %(strip)s rows (the tick strip, newest first), and its newest SUCCESS
-- and newest FAIL among its newest %(scan)s rows. Each lateral walks the
-- (code, acquired_at) index backwards and stops at its LIMIT, so a request
-- costs jobs x (strip + scan) rows at most, whatever the length of the history.
WITH jobs AS (
    SELECT code, ord FROM unnest(%(codes)b::text[]) WITH ORDINALITY AS j (code, ord)
)
SELECT jobs.code,
       strip.statuses, strip.reasons, strip.run_keys, strip.claimed,
       ok.run_key AS success_run_key, ok.owner AS success_owner,
       ok.acquired_at AS success_acquired_at, ok.finished_at AS success_finished_at,
       bad.run_key AS failure_run_key, bad.owner AS failure_owner, bad.reason AS failure_reason,
       bad.acquired_at AS failure_acquired_at, bad.finished_at AS failure_finished_at,
       bad.error AS failure_error
FROM jobs
LEFT JOIN LATERAL (
    SELECT array_agg(s.status ORDER BY s.acquired_at DESC) AS statuses,
           array_agg(s.reason ORDER BY s.acquired_at DESC) AS reasons,
           array_agg(s.run_key ORDER BY s.acquired_at DESC) AS run_keys,
           array_agg(s.acquired_at ORDER BY s.acquired_at DESC) AS claimed
    FROM (
        SELECT t.status, t.reason, t.run_key, t.acquired_at
        FROM {table} t
        WHERE t.code = jobs.code
        ORDER BY t.acquired_at DESC
        LIMIT %(strip)s
    ) s
) strip ON true
LEFT JOIN LATERAL (
    SELECT recent.run_key, recent.owner, recent.acquired_at, recent.finished_at
    FROM (
        SELECT t.run_key, t.owner, t.status, t.acquired_at, t.finished_at
        FROM {table} t
        WHERE t.code = jobs.code
        ORDER BY t.acquired_at DESC
        LIMIT %(scan)s
    ) recent
    WHERE recent.status = 'SUCCESS'
    ORDER BY recent.acquired_at DESC
    LIMIT 1
) ok ON true
LEFT JOIN LATERAL (
    SELECT recent.run_key, recent.owner, recent.reason, recent.acquired_at, recent.finished_at,
           left(recent.error, 500) AS error
    FROM (
        SELECT t.run_key, t.owner, t.status, t.reason, t.acquired_at, t.finished_at, t.error
        FROM {table} t
        WHERE t.code = jobs.code
        ORDER BY t.acquired_at DESC
        LIMIT %(scan)s
    ) recent
    WHERE recent.status = 'FAIL' AND coalesce(recent.reason, '') NOT IN ('waiting', 'backfill')
    ORDER BY recent.acquired_at DESC
    LIMIT 1
) bad ON true
ORDER BY jobs.ord

-- name: status_page_running
-- Every RUNNING row (live, or stale: its owner stopped heartbeating), oldest
-- first, bounded. The partial running index holds only these rows; each
-- one's running attempt record (its primary key) says why it runs.
SELECT l.code, l.type, l.run_key, l.lock_key, l.owner, l.attempt, l.fencing_token,
       l.acquired_at, l.heartbeat_at, l.expires_at, l.expires_at <= clock_timestamp() AS stale,
       a.trigger
FROM {table} l
LEFT JOIN {attempts} a ON a.lease_id = l.id AND a.fencing_token = l.fencing_token
WHERE l.status = 'RUNNING'
ORDER BY l.acquired_at
LIMIT %(limit)s

-- name: status_page_ticks
-- One job's newest rows for its status page, newest first, claimed within
-- [since, until) (null: unbounded), through the (code, acquired_at) index; the
-- idempotency key is the row's lock_key.
SELECT id, type, code, run_key, lock_key, status, reason, attempt, owner, fencing_token,
       acquired_at, heartbeat_at, finished_at, expires_at, retry_at, error,
       status = 'RUNNING' AND expires_at <= clock_timestamp() AS stale
FROM {table}
WHERE code = %(code)s
  AND acquired_at >= COALESCE(%(since)s::timestamptz, '-infinity')
  AND acquired_at < COALESCE(%(until)s::timestamptz, 'infinity')
ORDER BY acquired_at DESC
LIMIT %(limit)s

-- name: status_page_requests
-- One job's newest requests (detached manual runs) for its status page, newest
-- first: who asked, when, which replica took it, how its fire ended. Through
-- the (code, run_key) unique index; a job's requests are few (pruned with history).
SELECT run_key, requested_by, requested_at, taken_by, taken_at, done_at, outcome, trigger,
       params
FROM {requests}
WHERE code = %(code)s
ORDER BY requested_at DESC
LIMIT %(limit)s

-- name: status_page_replicas
-- Replicas seen recently, from the rows they hold or finished: the newest
-- %(limit)s SCHEDULE rows finished within the window (the finished index,
-- walked backwards) plus the RUNNING rows (the partial running index). A
-- replica that claimed nothing in the window is not seen: nothing else of it
-- is stored.
WITH seen AS (
    (SELECT owner, finished_at AS at, status
     FROM {table}
     WHERE type = 'SCHEDULE'
       -- statement_timestamp(), not clock_timestamp(): a stable bound is an index condition.
       AND finished_at > statement_timestamp() - %(within_ms)s * interval '1 millisecond'
     ORDER BY finished_at DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT owner, heartbeat_at, status
     FROM {table}
     WHERE status = 'RUNNING'
     LIMIT %(limit)s)
)
SELECT owner, max(at) AS last_seen, min(at) AS first_seen, count(*) AS runs,
       count(*) FILTER (WHERE status = 'RUNNING') AS running,
       count(*) FILTER (WHERE status = 'SUCCESS') AS successes,
       count(*) FILTER (WHERE status = 'FAIL') AS failures
FROM seen
GROUP BY owner
ORDER BY max(at) DESC, owner

-- name: sql_job_bounds
-- Server-side bounds that end an sql: job's transaction by its lease's expiry
-- (expires_at, as sql_job_lock read it: a heartbeat skips a locked row, so it
-- stands still while the job runs): the next statement's timeout (the job's
-- own, or less) and the wait for the client after it. So a client that stops
-- mid-transaction (killed, paused, partitioned) never holds the lease row's
-- lock past its lease, and a takeover claim finds the row free once it
-- lapsed. Set again after each statement and before the SUCCESS finalize,
-- never in pipeline mode: the Flush that ends a pipeline reaches the server
-- after its Sync, and a message read while idle disarms the idle timer until
-- the next Sync. left_ms: what the lease had left here (0 or less: lapsed; the
-- bounds are then 1 ms, since 0 would lift them). All for the transaction only
-- (nothing session-scoped, so PgBouncer in transaction pooling works). The
-- columns are named as sql_job_state reads them.
SELECT set_config('statement_timeout', least(%(statement_timeout_ms)s, b.bound_ms)::text, true)
         AS statement_timeout,
       set_config('idle_in_transaction_session_timeout', b.bound_ms::text, true)
         AS idle_in_transaction_session_timeout,
       CASE WHEN current_setting('server_version_num')::int >= 140000
            THEN set_config('client_connection_check_interval', %(check_interval_ms)s::text, true)
       END AS client_connection_check_interval,
       b.left_ms
FROM (
    SELECT l.left_ms, greatest(l.left_ms, 1) AS bound_ms
    FROM (
        SELECT floor(extract(epoch FROM %(expires_at)s::timestamptz - clock_timestamp()) * 1000)
                 ::bigint AS left_ms
    ) l
) b

-- name: sql_job_lock
-- The first statement of an sql: job's transaction, its fencing check: the
-- lease row, still ours by owner token and live, locked FOR UPDATE until the
-- transaction ends, so nobody can take the tick over while the job's own
-- statements run and the SUCCESS recorded after them cannot be fenced. No
-- row: fenced (or lapsed), and nothing runs. Its expiry is returned for
-- sql_job_bounds; the wait for the client until those are set ends with the
-- lease already (the statement that takes the lock arms that bound).
SELECT set_config('idle_in_transaction_session_timeout',
                  greatest(floor(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000), 1)
                    ::bigint::text,
                  true) AS idle_in_transaction_session_timeout,
       l.expires_at
FROM (
    SELECT expires_at FROM {table}
    WHERE id = %(id)s AND owner_token = %(owner_token)s AND status = 'RUNNING'
      AND expires_at > clock_timestamp()
    FOR UPDATE
) l

-- name: sql_job_role
-- The job's role (SET LOCAL ROLE) for its own statements only.
SELECT set_config('role', %(role)s, true) AS role

-- name: sql_job_state
-- What an sql: job's statements must leave as they found it, read after the
-- set-up and after each statement: who they run as, the bounds sql_job_bounds
-- set, and the transaction they run in (its start time: a statement that
-- ended it is seen even if another began).
SELECT current_user AS "current_user",
       session_user AS "session_user",
       current_setting('statement_timeout') AS statement_timeout,
       current_setting('idle_in_transaction_session_timeout')
         AS idle_in_transaction_session_timeout,
       current_setting('client_connection_check_interval', true)
         AS client_connection_check_interval,
       current_setting('transaction_timeout', true) AS transaction_timeout,
       transaction_timestamp() AS transaction_started

-- name: sql_job_reset_settings
-- After an sql: job's statements, in its transaction: every setting back to
-- the session's default, including any a statement set session-wide (a
-- function's set_config(…, false)); committed with the SUCCESS, so behind a
-- transaction pooler too nothing of the job outlives it on the connection.
RESET ALL

-- name: sql_job_reset_user
-- The same for the session's user and role (RESET ALL leaves them alone).
SET SESSION AUTHORIZATION DEFAULT

-- name: status_page_no_jit
-- Sent before a status page statement, in the same message and implicit
-- transaction: the planner's cost of a lateral per job (a thousand jobs) passes
-- jit_above_cost, and compiling takes longer than the statement itself runs.
SELECT set_config('jit', 'off', true) AS jit

-- name: sql_job_success
-- The SUCCESS finalize of an sql: job, in its own transaction after its
-- statements: by the current owner only (the row is locked by sql_job_lock
-- since the start of the transaction, so it is still ours), while its lease
-- holds (past it, a takeover may be due: the transaction is rolled back).
-- Its attempt record is closed as a success with it; the output follows
-- (attempt_close).
WITH done AS (
    UPDATE {table}
    SET status = 'SUCCESS', finished_at = clock_timestamp(), reason = NULL, error = NULL,
        retry_at = NULL
    WHERE id = %(id)s AND owner_token = %(owner_token)s AND status = 'RUNNING'
      AND expires_at > clock_timestamp()
    RETURNING id, fencing_token
), closed AS (
    UPDATE {attempts} AS a
    SET status = 'success', finished_at = clock_timestamp()
    FROM done d
    WHERE a.lease_id = d.id AND a.fencing_token = d.fencing_token
)
SELECT id FROM done

-- name: status_page_failing
-- The codes, in the order given, whose newest finished run (SUCCESS or FAIL) is
-- a FAIL: one probe per job down the (code, acquired_at) index, stopping at the
-- first finished row, so every page of the jobs view can say what is failing.
SELECT j.code
FROM unnest(%(codes)b::text[]) WITH ORDINALITY AS j (code, ord)
CROSS JOIN LATERAL (
    SELECT t.status
    FROM {table} t
    WHERE t.code = j.code AND t.status IN ('SUCCESS', 'FAIL')
      AND coalesce(t.reason, '') NOT IN ('waiting', 'backfill')
    ORDER BY t.acquired_at DESC
    LIMIT 1
) last
WHERE last.status = 'FAIL'
ORDER BY j.ord

-- name: request_run
-- `pgcrond trigger CODE --detach`: record a request and wake every replica, in
-- one statement (one transaction: the notification is delivered at commit, with
-- the row already visible). Shells requesting the same run key make one row; a
-- request whose earlier one is done is opened again (the lease still decides
-- whether anything runs), as a manual run with these parameters (a backfill's
-- done request leaves its backfill). Returns the row as it was before (NULL
-- when new), whether this statement opened the request, and the run key's lease row.
WITH opened AS (
    INSERT INTO {requests} AS r (
        code, run_key, requested_by, requested_at, trigger, params, concurrency
    )
    VALUES (%(code)s, %(run_key)s, %(by)s, now(), 'manual', %(params)s, %(concurrency)s)
    ON CONFLICT (code, run_key) DO UPDATE
    SET requested_by = EXCLUDED.requested_by, requested_at = EXCLUDED.requested_at,
        taken_by = NULL, taken_at = NULL, done_at = NULL, outcome = NULL,
        trigger = EXCLUDED.trigger, params = EXCLUDED.params,
        concurrency = EXCLUDED.concurrency, backfill_id = NULL, seq = NULL
    WHERE r.done_at IS NOT NULL
    RETURNING r.id
), woken AS (
    SELECT pg_notify(%(channel)s, %(code)s) AS sent
)
SELECT (opened.id IS NOT NULL) AS opened,
       earlier.requested_by, earlier.requested_at, earlier.taken_by, earlier.taken_at,
       earlier.done_at, earlier.outcome, earlier.trigger, earlier.params,
       lease.status AS lease_status, lease.reason AS lease_reason, lease.owner AS lease_owner,
       lease.retry_at AS lease_retry_at
FROM woken
LEFT JOIN opened ON true
LEFT JOIN {requests} earlier ON earlier.code = %(code)s AND earlier.run_key = %(run_key)s
LEFT JOIN {table} lease
       ON lease.code = %(code)s AND lease.type = 'SCHEDULE' AND lease.run_key = %(run_key)s

-- name: request_progress
-- `pgcrond trigger` following its request: the request row (who took it, when
-- its run started and ended, with what) and the run key's lease row (running
-- where, which attempt). Two primary-key/unique-index reads.
SELECT r.taken_by, r.taken_at, r.done_at, r.outcome,
       lease.id AS lease_id, lease.status AS lease_status, lease.owner AS lease_owner,
       lease.attempt AS lease_attempt, lease.error AS lease_error
FROM (SELECT 1) one
LEFT JOIN {requests} r ON r.code = %(code)s AND r.run_key = %(run_key)s
LEFT JOIN {table} lease
       ON lease.code = %(code)s AND lease.type = 'SCHEDULE' AND lease.run_key = %(run_key)s

-- name: take_requests
-- A replica takes the pending requests of its jobs: not done, not taken (or
-- taken and not kept for so long that its taker died: firing it again is
-- safe, the lease decides; an advisory one that started is not run again),
-- requested within the window. The same statement keeps this replica's own
-- running requests taken (%(running)b: their taken_at is renewed), so only a
-- dead taker's go stale, and says whether any request of these jobs is still
-- open (the last row, id NULL): while one is, the replica takes again on a
-- slow timer. SKIP LOCKED: replicas woken together take disjoint rows.
-- Bounded, down the partial pending index.
-- A backfill's request is taken only while fewer than its max_parallel
-- requests before it (by seq) are not done: those taken and not done are then
-- always among the first max_parallel not done, so at most max_parallel of its
-- ticks run at once, in tick order, whichever replicas take them (a snapshot
-- that has not seen a request end only makes a take wait). It is not bound by
-- the window: a long backfill's last ticks are filed long before they run.
WITH kept AS (
    UPDATE {requests}
    SET taken_at = now()
    WHERE id = ANY(%(running)b::bigint[]) AND taken_by = %(by)s AND done_at IS NULL
    RETURNING id
), taken AS (
    UPDATE {requests} r
    SET taken_by = %(by)s, taken_at = now()
    FROM (
        SELECT p.id
        FROM {requests} p
        LEFT JOIN {backfills} b ON b.id = p.backfill_id
        WHERE p.done_at IS NULL AND p.code = ANY(%(codes)b::text[])
          AND NOT (p.id = ANY(%(running)b::bigint[]))
          AND (p.backfill_id IS NOT NULL
               OR p.requested_at > now() - %(within_ms)s * interval '1 millisecond')
          AND (p.taken_at IS NULL
               OR p.taken_at < now() - %(retake_ms)s * interval '1 millisecond')
          AND (b.id IS NULL OR b.max_parallel > (
              SELECT count(*) FROM (
                  SELECT 1 FROM {requests} e
                  WHERE e.backfill_id = p.backfill_id AND e.seq < p.seq AND e.done_at IS NULL
                  LIMIT b.max_parallel
              ) earlier
          ))
        ORDER BY p.requested_at, p.seq
        LIMIT %(limit)s
        FOR UPDATE OF p SKIP LOCKED
    ) pending
    WHERE r.id = pending.id
    RETURNING r.id, r.code, r.run_key, r.requested_by, r.requested_at, r.taken_at, r.started_at,
              r.trigger, r.params, r.concurrency, r.backfill_id
)
SELECT id, code, run_key, requested_by, requested_at, taken_at, started_at, trigger, params,
       concurrency, backfill_id, NULL::boolean AS open
FROM taken
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, EXISTS (
    SELECT 1 FROM {requests} o
    WHERE o.done_at IS NULL AND o.code = ANY(%(codes)b::text[])
      AND (o.backfill_id IS NOT NULL
           OR o.requested_at > now() - %(within_ms)s * interval '1 millisecond')
)

-- name: start_request
-- The taker's run of a request starts (advisory guard: nothing else records it).
UPDATE {requests}
SET started_at = now()
WHERE id = %(id)s AND taken_by = %(by)s AND done_at IS NULL

-- name: prune_requests
-- Delete one batch of requests whose fire ended before the cutoff (history
-- pruning's age): pending and taken ones stay.
DELETE FROM {requests}
WHERE id IN (
    SELECT id FROM {requests}
    WHERE done_at < now() - %(older_than_ms)s * interval '1 millisecond'
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)

-- name: finish_request
-- The taker's fire came to an end: what it came to here (history has the run).
-- A backfill's wakes the replicas: its next tick may be taken now.
WITH done AS (
    UPDATE {requests}
    SET done_at = now(), outcome = %(outcome)s
    WHERE id = %(id)s AND taken_by = %(by)s AND done_at IS NULL
    RETURNING code, backfill_id
), woken AS (
    SELECT pg_notify(%(channel)s, code) AS sent FROM done WHERE backfill_id IS NOT NULL
)
SELECT count(*) AS finished, (SELECT count(*) FROM woken) AS woken FROM done

-- name: release_request
-- A taker that stops before it ran the request gives it back and wakes the
-- other replicas, so that one of them takes it now.
WITH released AS (
    UPDATE {requests}
    SET taken_by = NULL, taken_at = NULL
    WHERE id = %(id)s AND taken_by = %(by)s AND done_at IS NULL
    RETURNING code
)
SELECT pg_notify(%(channel)s, code) AS sent FROM released

-- name: registry_join
-- Enter (or re-enter) the registry: a replica's start, a reload, or a touch
-- that found its row gone. Takes the name only if no other live instance holds
-- it (the same instance re-joining keeps its started_at, and its config_at
-- while the config hash is unchanged); a stopped holder's row is taken over.
-- No row back: the name is taken. Rows of replicas not seen for
-- %(keep_stopped_ms)s are deleted by the same statement.
WITH pruned AS (
    DELETE FROM {replicas}
    WHERE last_seen < clock_timestamp() - %(keep_stopped_ms)s * interval '1 millisecond'
      AND name <> %(name)s
)
INSERT INTO {replicas} AS r
    (name, instance, version, config_hash, config_at, job_hashes, definitions, started_at,
     last_seen)
VALUES (%(name)s, %(instance)s, %(version)s, %(config_hash)s, clock_timestamp(),
        %(job_hashes)s, %(definitions)s, clock_timestamp(), clock_timestamp())
ON CONFLICT (name) DO UPDATE SET
    instance = EXCLUDED.instance,
    version = EXCLUDED.version,
    config_hash = EXCLUDED.config_hash,
    config_at = CASE WHEN r.instance = EXCLUDED.instance AND r.config_hash = EXCLUDED.config_hash
                     THEN r.config_at ELSE EXCLUDED.config_at END,
    job_hashes = EXCLUDED.job_hashes,
    definitions = EXCLUDED.definitions,
    started_at = CASE WHEN r.instance = EXCLUDED.instance
                      THEN r.started_at ELSE EXCLUDED.started_at END,
    last_seen = EXCLUDED.last_seen,
    stopped_at = NULL
WHERE r.instance = EXCLUDED.instance
   OR r.stopped_at IS NOT NULL
   OR r.last_seen < clock_timestamp() - %(gone_after_ms)s * interval '1 millisecond'
RETURNING name

-- name: registry_holder
-- Who holds a name that registry_join could not take (only on that error path).
SELECT name, version, started_at, last_seen FROM {replicas} WHERE name = %(name)s

-- name: registry_touch
-- The registry's one idle statement, once a minute per replica: say this
-- replica is alive and, in the same round trip, count the config hashes that
-- live replicas run (the drift gauge) and name the live replicas (the peers
-- spread shares ticks with). touched = 0: the row is gone (deleted by hand,
-- or taken over after a long outage): the replica joins again.
WITH touched AS (
    UPDATE {replicas} SET last_seen = clock_timestamp()
    WHERE name = %(name)s AND instance = %(instance)s AND stopped_at IS NULL
    RETURNING name
)
SELECT (SELECT count(*) FROM touched) AS touched, count(DISTINCT config_hash) AS hashes,
       coalesce(array_agg(name ORDER BY name), '{{}}') AS names
FROM {replicas}
WHERE last_seen > clock_timestamp() - %(gone_after_ms)s * interval '1 millisecond'
  AND stopped_at IS NULL

-- name: registry_leave
-- A clean stop: this instance's row stays, marked stopped, with the config it
-- ran (`pgcrond plan` against the last config while none runs); a newer
-- holder of the name keeps its own row.
UPDATE {replicas} SET stopped_at = clock_timestamp(), last_seen = clock_timestamp()
WHERE name = %(name)s AND instance = %(instance)s

-- name: registry_live
-- The live replicas, by name; definitions only when asked (`pgcrond plan`).
SELECT name, version, config_hash, config_at, job_hashes, started_at, last_seen,
       CASE WHEN %(definitions)s THEN definitions END AS definitions
FROM {replicas}
WHERE last_seen > clock_timestamp() - %(gone_after_ms)s * interval '1 millisecond'
  AND stopped_at IS NULL
ORDER BY name

-- name: registry_last_seen
-- `pgcrond plan` while no replica is live: the row seen last, stopped or gone,
-- with the config it ran.
SELECT name, version, config_hash, config_at, job_hashes, started_at, last_seen, stopped_at,
       definitions
FROM {replicas}
ORDER BY last_seen DESC, name
LIMIT 1

-- name: codes_with_history
-- Which of these job codes have any row (`pgcrond plan` with no config ever
-- recorded: such a job is known to the cluster, not new). One index probe each.
SELECT c.code FROM unnest(%(codes)b::text[]) AS c(code)
WHERE EXISTS (SELECT 1 FROM {table} t WHERE t.code = c.code)

-- name: rename_lock
-- Serialise renames of one table across replicas starting at once: the second
-- finds the rows moved already and moves nothing. Held to the transaction's end.
SELECT pg_advisory_xact_lock(%(lock_id)s)

-- name: rename_reclaim_initial
-- Before a rename moves run-once state to its new code: a mark an earlier
-- rename left under the new code's INITIAL key (the code was renamed away,
-- and is renamed back now) is dropped, so the old codes' row can move in; or,
-- when no old code has run-once state, so the job runs once under it. Kept
-- while an old code's own state moved on elsewhere (it holds a mark too).
DELETE FROM {table} t
WHERE t.lock_key = %(initial_key)s AND t.status = 'SKIPPED' AND t.reason = 'renamed'
  AND NOT EXISTS (
      SELECT 1 FROM {table} o
      WHERE o.type = 'INITIAL' AND o.code = ANY(%(old)b::text[])
        AND o.status = 'SKIPPED' AND o.reason = 'renamed'
  )

-- name: rename_job
-- Move the rows of a renamed job's old codes to its new code: its history and
-- open ticks (each keeping the key it was claimed with: key_code records the
-- code that key came from), its newest run-once row (re-keyed to the new
-- code's INITIAL identity, so the run-once job does not run again; never a
-- mark of rename_mark_initial) and its pause. A row whose tick the new code
-- has already (both codes ran it while replicas disagreed) stays under its old
-- code. Idempotent: a second run finds nothing under the old codes to move.
WITH schedule_rows AS (
    UPDATE {table} t
    SET code = %(code)s, key_code = coalesce(t.key_code, t.code)
    WHERE t.type = 'SCHEDULE' AND t.code = ANY(%(old)b::text[])
      AND NOT EXISTS (
          SELECT 1 FROM {table} n
          WHERE n.type = 'SCHEDULE' AND n.code = %(code)s AND n.run_key = t.run_key
      )
    RETURNING 1
), initial_row AS (
    UPDATE {table} t
    SET code = %(code)s, lock_key = %(initial_key)s, key_code = NULL
    WHERE t.id = (
        SELECT id FROM {table}
        WHERE type = 'INITIAL' AND code = ANY(%(old)b::text[])
          AND NOT (status = 'SKIPPED' AND reason = 'renamed')
        ORDER BY status = 'SUCCESS' DESC, acquired_at DESC
        LIMIT 1
    )
      AND NOT EXISTS (SELECT 1 FROM {table} n WHERE n.lock_key = %(initial_key)s)
    RETURNING 1
), pause_row AS (
    UPDATE {job_state} s
    SET code = %(code)s
    WHERE s.code = (SELECT min(code) FROM {job_state} WHERE code = ANY(%(old)b::text[]))
      AND NOT EXISTS (SELECT 1 FROM {job_state} n WHERE n.code = %(code)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM schedule_rows) AS ticks,
       (SELECT count(*) FROM initial_row) AS initial,
       (SELECT count(*) FROM pause_row) AS paused

-- name: rename_mark_initial
-- After the move, in the same transaction: each old code's INITIAL key gets a
-- row SKIPPED/renamed where it has none, so a replica still on a config with
-- the old code (a restart during the rollout, a rollback) finds its run-once
-- job settled and does not run it: the run-once state is the new code's,
-- whether the job ran before the rename (its row moved) or not yet. A claim
-- of the old key waiting on the move's lock sees this row when it commits.
INSERT INTO {table} (
    lock_key, type, code, run_key, status, owner_token, owner, attempt, fencing_token,
    lease_ms, created_at, acquired_at, heartbeat_at, expires_at, finished_at, reason, error
)
SELECT o.lock_key, 'INITIAL', o.code, NULL, 'SKIPPED', gen_random_uuid(), %(owner)s, 0,
       nextval({fencing_seq_name}), 1000, clock_timestamp(), clock_timestamp(),
       clock_timestamp(), clock_timestamp(), clock_timestamp(), 'renamed',
       'renamed to ' || %(code)s || ': its run-once state is under that code, and a '
       || 'replica of a config with this code does not run it'
FROM unnest(%(old_keys)b::text[], %(old)b::text[]) AS o (lock_key, code)
ORDER BY o.lock_key
ON CONFLICT (lock_key) DO NOTHING

-- name: attempt_close
-- Close one attempt record outside a finalize: an sql: job's SUCCESS was
-- committed with its own statements, and its record is told afterwards.
UPDATE {attempts}
SET status = %(status)s,
    finished_at = coalesce(finished_at, clock_timestamp()),
    error = left(%(error)s, 4000),
    exit_code = %(exit_code)s,
    duration_ms = %(duration_ms)s,
    stdout_head = %(stdout_head)s, stdout_tail = %(stdout_tail)s,
    stdout_dropped = %(stdout_dropped)s,
    stderr_head = %(stderr_head)s, stderr_tail = %(stderr_tail)s,
    stderr_dropped = %(stderr_dropped)s
WHERE lease_id = %(id)s AND fencing_token = %(fencing_token)s

-- name: attempts
-- One job's attempt records, newest first, with their output (`pgcrond logs`,
-- the status page): of one run key and one attempt number when given (NULL:
-- any). Ticks are walked newest first through the (code, acquired_at) index
-- and each one's records read by its key, so the cost grows with what is
-- shown, not with the job's history.
SELECT l.code, l.type, l.run_key, l.status AS tick_status, a.lease_id, a.fencing_token,
       a.attempt, a.replica, a.started_at, a.finished_at, a.status, a.error, a.exit_code,
       a.duration_ms, a.stdout_head, a.stdout_tail, a.stdout_dropped, a.stderr_head,
       a.stderr_tail, a.stderr_dropped, a.trigger, q.params
FROM {table} l
JOIN LATERAL (
    SELECT * FROM {attempts} r
    WHERE r.lease_id = l.id AND (%(attempt)s::integer IS NULL OR r.attempt = %(attempt)s)
) a ON true
LEFT JOIN {requests} q ON q.code = l.code AND q.run_key = l.run_key
WHERE l.code = %(code)s
  AND (%(run_key)s::text IS NULL OR l.run_key = %(run_key)s)
ORDER BY l.acquired_at DESC, l.id DESC, a.fencing_token DESC
LIMIT %(limit)s

-- name: attempts_of
-- The attempt records of these lease rows, oldest first per row (history, the
-- status page); the output columns only with %(output)s.
SELECT a.lease_id, a.fencing_token, a.attempt, a.replica, a.started_at, a.finished_at,
       a.status, a.error, a.exit_code, a.duration_ms, a.trigger,
       CASE WHEN %(output)s THEN a.stdout_head END AS stdout_head,
       CASE WHEN %(output)s THEN a.stdout_tail END AS stdout_tail,
       a.stdout_dropped,
       CASE WHEN %(output)s THEN a.stderr_head END AS stderr_head,
       CASE WHEN %(output)s THEN a.stderr_tail END AS stderr_tail,
       a.stderr_dropped
FROM {attempts} a
WHERE a.lease_id = ANY(%(ids)b::bigint[])
ORDER BY a.lease_id, a.fencing_token

-- name: failure_streak
-- A job's failed ticks in a row (FAIL with no retry time, as job_ticks counts
-- them) since its newest SUCCESS other than this identity's own: after a
-- success, whether it is a recovery; after a final failure, whether the job
-- is to be paused (pause_after_failures). Both walk the (code, acquired_at) index.
SELECT count(*) AS failures
FROM {table} f
WHERE f.code = %(code)s AND f.status = 'FAIL' AND f.retry_at IS NULL
  AND f.acquired_at > coalesce((
      SELECT s.acquired_at FROM {table} s
      WHERE s.code = %(code)s AND s.status = 'SUCCESS'
        AND NOT (s.type = %(type)s AND s.run_key IS NOT DISTINCT FROM %(run_key)s::text)
      ORDER BY s.acquired_at DESC, s.id DESC LIMIT 1
  ), '-infinity')

-- name: backfill_rows
-- What a backfill finds for each tick of its range: the tick's lease row (if
-- any) and a request of its run key not done yet (if any). Unique-index reads.
SELECT t.run_key, l.status, l.reason, l.owner, l.retry_at, l.error,
       r.requested_by AS pending_by, r.trigger AS pending_trigger
FROM unnest(%(run_keys)b::text[]) AS t (run_key)
LEFT JOIN {table} l ON l.code = %(code)s AND l.type = 'SCHEDULE' AND l.run_key = t.run_key
LEFT JOIN {requests} r ON r.code = %(code)s AND r.run_key = t.run_key AND r.done_at IS NULL

-- name: backfill_file
-- `pgcrond backfill`: file a backfill in one statement (one transaction; the
-- notification goes out at commit). Each tick to run gets a lease row FAIL/
-- backfill that is due now (a tick with no row gets one, sorting at its tick;
-- a MISSED row or a final FAIL is opened again, its old state kept in the
-- error text): the request's fire claims it like any retry, so pause and the
-- overlap policy apply, it has no misfire bound, and a takeover of it after a
-- kill is an ordinary takeover. A row that is anything else by now (SUCCESS,
-- RUNNING, a retry pending, SKIPPED) is left alone and its tick not filed;
-- the statement decides, not the command's earlier read. Then one request per
-- opened tick, in tick order (seq), with the backfill's parameters.
WITH backfill AS (
    INSERT INTO {backfills} (code, range_from, range_to, requested_by, requested_at, max_parallel)
    VALUES (%(code)s, %(range_from)s, %(range_to)s, %(by)s, now(), %(max_parallel)s)
    RETURNING id, requested_at
), ticks AS (
    SELECT *
    FROM unnest(%(lock_keys)b::text[], %(run_keys)b::text[], %(ticks)b::timestamptz[])
         WITH ORDINALITY AS t (lock_key, run_key, tick, seq)
), opened AS (
    INSERT INTO {table} AS l (
        lock_key, type, code, run_key, status, owner_token, owner, attempt, fencing_token,
        lease_ms, created_at, acquired_at, heartbeat_at, expires_at, finished_at, retry_at,
        reason, error
    )
    SELECT t.lock_key, 'SCHEDULE', %(code)s, t.run_key, 'FAIL', gen_random_uuid(), %(by)s, 0,
           nextval({fencing_seq_name}), %(lease_ms)s, clock_timestamp(), t.tick,
           clock_timestamp(), clock_timestamp(), clock_timestamp(), clock_timestamp(),
           'backfill', 'filed by backfill ' || b.id || ' (' || %(by)s || ')'
    FROM ticks t CROSS JOIN backfill b
    ORDER BY t.lock_key
    ON CONFLICT (lock_key) DO UPDATE SET
        status = 'FAIL',
        owner_token = EXCLUDED.owner_token,
        owner = EXCLUDED.owner,
        finished_at = EXCLUDED.finished_at,
        retry_at = EXCLUDED.retry_at,
        reason = 'backfill',
        error = left(EXCLUDED.error || '; it was ' || l.status || coalesce('/' || l.reason, '')
                     || coalesce(': ' || l.error, ''), 4000)
    WHERE l.status = 'MISSED' OR (l.status = 'FAIL' AND l.retry_at IS NULL)
    RETURNING l.lock_key
), filed AS (
    INSERT INTO {requests} AS r (
        code, run_key, requested_by, requested_at, trigger, params, concurrency, backfill_id, seq
    )
    SELECT %(code)s, t.run_key, %(by)s, b.requested_at, 'backfill', %(params)s, %(concurrency)s,
           b.id, t.seq
    FROM ticks t JOIN opened o ON o.lock_key = t.lock_key CROSS JOIN backfill b
    ON CONFLICT (code, run_key) DO UPDATE SET
        requested_by = EXCLUDED.requested_by, requested_at = EXCLUDED.requested_at,
        taken_by = NULL, taken_at = NULL, done_at = NULL, outcome = NULL, started_at = NULL,
        trigger = EXCLUDED.trigger, params = EXCLUDED.params,
        concurrency = EXCLUDED.concurrency, backfill_id = EXCLUDED.backfill_id, seq = EXCLUDED.seq
    WHERE r.done_at IS NOT NULL
    RETURNING r.run_key
), woken AS (
    SELECT pg_notify(%(channel)s, %(code)s) AS sent
)
SELECT b.id, b.requested_at, ARRAY(SELECT run_key FROM filed) AS filed
FROM backfill b, woken

-- name: backfill_progress
-- Where each tick of a backfill stands: its request (taken, done, with what)
-- and its lease row (status, attempt, owner) with the newest attempt's trigger
-- kind. In tick order, down the (backfill_id, seq) index.
SELECT r.run_key, r.seq, r.taken_by, r.done_at, r.outcome,
       l.status AS lease_status, l.owner AS lease_owner, l.attempt AS lease_attempt,
       l.error AS lease_error,
       (SELECT a.trigger FROM {attempts} a WHERE a.lease_id = l.id
        ORDER BY a.fencing_token DESC LIMIT 1) AS trigger
FROM {requests} r
LEFT JOIN {table} l ON l.code = r.code AND l.type = 'SCHEDULE' AND l.run_key = r.run_key
WHERE r.backfill_id = %(id)s
ORDER BY r.seq

-- name: running_backfills
-- The backfills with a tick still to run, with their counts (the status
-- page): done, running (taken), left (not taken). Backfills are few; each
-- one's requests are read down the (backfill_id, seq) index.
SELECT b.id, b.code, b.range_from, b.range_to, b.requested_by, b.requested_at,
       b.max_parallel, c.done, c.running, c.left_
FROM {backfills} b
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE r.done_at IS NOT NULL) AS done,
           count(*) FILTER (WHERE r.done_at IS NULL AND r.taken_by IS NOT NULL) AS running,
           count(*) FILTER (WHERE r.done_at IS NULL AND r.taken_by IS NULL) AS left_
    FROM {requests} r
    WHERE r.backfill_id = b.id
) c
WHERE c.running + c.left_ > 0
  AND (%(code)s::text IS NULL OR b.code = %(code)s)
ORDER BY b.id

-- name: prune_backfills
-- Backfills whose every request was pruned (history pruning's age).
DELETE FROM {backfills} b
WHERE b.requested_at < now() - %(older_than_ms)s * interval '1 millisecond'
  AND NOT EXISTS (SELECT 1 FROM {requests} r WHERE r.backfill_id = b.id)
