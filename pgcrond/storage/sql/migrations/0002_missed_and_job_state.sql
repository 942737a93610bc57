-- Every expected tick ends with a row: MISSED joins the statuses (a tick no
-- replica could run within its misfire_grace), and a finished tick that was not
-- run says why in its reason. The column CHECK of 0001 carries PostgreSQL's
-- generated name ({table}_status_check).
ALTER TABLE {table} DROP CONSTRAINT {status_check};
ALTER TABLE {table} ADD CONSTRAINT {status_check}
    CHECK (status IN ('RUNNING', 'SUCCESS', 'FAIL', 'SKIPPED', 'MISSED'));
-- The reasons a tick ends without a run (docs/operations.md has the table):
-- SKIPPED: overlap (concurrency: forbid), paused (`pgcrond pause`), suspended
-- (suspended: true in the YAML); MISSED: no_replica (none was running),
-- database_unavailable (none could reach the database), late (a replica fired
-- after the window).
ALTER TABLE {table} ADD CONSTRAINT {reason_check} CHECK (
    (status <> 'SKIPPED' OR reason IN ('overlap', 'paused', 'suspended'))
    AND (status <> 'MISSED' OR reason IN ('no_replica', 'database_unavailable', 'late'))
);

-- Cluster-wide job state: a row is a paused job (code '*': every job). The
-- claim statement reads it in its own round trip, so a pause is honoured at the
-- next tick by every replica with no reload and no polling.
CREATE TABLE {job_state} (
    code      text        PRIMARY KEY,
    paused_by text        NOT NULL,
    paused_at timestamptz NOT NULL,
    reason    text
);
