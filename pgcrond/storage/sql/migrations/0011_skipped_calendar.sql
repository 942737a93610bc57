-- A tick on a day of one of its job's calendars (skip_on) is recorded
-- SKIPPED with the reason 'calendar:<name>', once for the cluster, never run.
ALTER TABLE {table} DROP CONSTRAINT {reason_check};
ALTER TABLE {table} ADD CONSTRAINT {reason_check} CHECK (
    (status <> 'SKIPPED' OR reason IN ('overlap', 'paused', 'suspended', 'renamed')
        OR reason LIKE 'calendar:_%')
    AND (status <> 'MISSED' OR reason IN ('no_replica', 'database_unavailable', 'late', 'coalesced'))
);
