-- The replica registry: a row per live replica and the config it runs, written
-- at its start and reload and touched at most once a minute; a clean stop
-- deletes it. A row not seen for a while (GONE_AFTER in storage/registry.py)
-- counts as gone, and its name may be taken again. `instance` tells the
-- process that wrote the row from another that took the same name.
CREATE TABLE {replicas} (
    name        text        PRIMARY KEY,
    instance    uuid        NOT NULL,
    version     text        NOT NULL,
    config_hash text        NOT NULL,
    -- When this replica began running config_hash (its start, or the reload that changed it).
    config_at   timestamptz NOT NULL,
    -- code -> short digest of the job's canonical definition.
    job_hashes  jsonb       NOT NULL,
    -- code -> the canonical definition itself (secrets digested), for `pgcrond plan`.
    definitions jsonb       NOT NULL,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL
);

-- A job renamed (renamed_from) takes its old code's rows; a tick claimed under
-- the old code keeps the idempotency key (lock_key) it was claimed with, and
-- key_code says which code that key was derived from, so a retry or takeover
-- under the new code presents the same key. NULL: the row's own code.
ALTER TABLE {table} ADD COLUMN key_code text;
