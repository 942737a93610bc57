-- Overlap policies beyond forbid (pgcrond/core/overlap.py). A tick that
-- concurrency: replace stops is closed SKIPPED/replaced once its owner reports
-- the stop (its attempt record 'replaced'); until then its row stays RUNNING
-- with the reason 'replaced', counted as running. A tick that waits for a
-- running one (buffer_one, replace) is a FAIL/waiting row due at once, which
-- the claim refuses while the job's slot is taken: the partial index finds a
-- job's waiting tick without walking its history.
ALTER TABLE {table} DROP CONSTRAINT {reason_check};
ALTER TABLE {table} ADD CONSTRAINT {reason_check} CHECK (
    (status <> 'SKIPPED' OR reason IN ('overlap', 'paused', 'suspended', 'renamed', 'replaced')
        OR reason LIKE 'calendar:_%')
    AND (status <> 'MISSED' OR reason IN ('no_replica', 'database_unavailable', 'late', 'coalesced'))
);
ALTER TABLE {attempts} DROP CONSTRAINT {attempts_status_check};
ALTER TABLE {attempts} ADD CONSTRAINT {attempts_status_check}
    CHECK (status IN ('running', 'success', 'fail', 'timeout', 'released', 'lost', 'replaced'));
CREATE INDEX {waiting_index} ON {table} (code) WHERE status = 'FAIL' AND reason = 'waiting';
