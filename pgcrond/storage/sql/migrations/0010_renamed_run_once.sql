-- A renamed run-once job (renamed_from) leaves a row SKIPPED with the reason
-- 'renamed' under each old code's INITIAL key: a replica still on a config
-- with the old code finds its run-once job settled there and does not run it.
ALTER TABLE {table} DROP CONSTRAINT {reason_check};
ALTER TABLE {table} ADD CONSTRAINT {reason_check} CHECK (
    (status <> 'SKIPPED' OR reason IN ('overlap', 'paused', 'suspended', 'renamed'))
    AND (status <> 'MISSED' OR reason IN ('no_replica', 'database_unavailable', 'late', 'coalesced'))
);
