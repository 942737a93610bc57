-- The lease table: one row per identity (type, code, run key).
-- The UNIQUE lock_key is the one-winner guarantee; everything else is bookkeeping.
CREATE TABLE {table} (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_key      text        NOT NULL,
    type          text        NOT NULL CHECK (type IN ('SCHEDULE', 'INITIAL')),
    code          text        NOT NULL,
    run_key       text,
    status        text        NOT NULL CHECK (status IN ('RUNNING', 'SUCCESS', 'FAIL', 'SKIPPED')),
    owner_token   uuid        NOT NULL,
    owner         text        NOT NULL,
    attempt       integer     NOT NULL,
    fencing_token bigint      NOT NULL,
    lease_ms      bigint      NOT NULL CHECK (lease_ms > 2),
    created_at    timestamptz NOT NULL,
    acquired_at   timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    retry_at      timestamptz,
    reason        text,
    error         text,
    CONSTRAINT {lock_key_unique} UNIQUE (lock_key),
    CONSTRAINT {run_key_by_type} CHECK ((type = 'INITIAL') = (run_key IS NULL))
);

-- Fencing tokens come from one sequence, so they increase with every claim of
-- an identity (and across identities too).
CREATE SEQUENCE {fencing_seq};

CREATE INDEX {code_index} ON {table} (code, acquired_at DESC);
CREATE INDEX {running_index} ON {table} (code) WHERE status = 'RUNNING';
CREATE INDEX {finished_index} ON {table} (finished_at) WHERE type = 'SCHEDULE';
