-- late_ticks: coalesce: of several ticks of a job due at once because they are
-- late (a restart, a stalled loop, a clock step), only the newest runs; the
-- claim records the others MISSED with the reason 'coalesced'.
ALTER TABLE {table} DROP CONSTRAINT {reason_check};
ALTER TABLE {table} ADD CONSTRAINT {reason_check} CHECK (
    (status <> 'SKIPPED' OR reason IN ('overlap', 'paused', 'suspended'))
    AND (status <> 'MISSED' OR reason IN ('no_replica', 'database_unavailable', 'late', 'coalesced'))
);
