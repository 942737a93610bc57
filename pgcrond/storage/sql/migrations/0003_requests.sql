-- Requests: detached manual runs (`pgcrond trigger CODE --detach`) waiting for
-- a replica to take them. One row per (job, run key), so shells requesting the
-- same run key together make one request; the lease table still decides which
-- replica runs it. The command inserts and NOTIFYs in one transaction; each
-- replica LISTENs on one connection of its own and takes pending rows with one
-- bounded statement (storage/requests.py).
CREATE TABLE {requests} (
    id           bigserial   PRIMARY KEY,
    code         text        NOT NULL,
    run_key      text        NOT NULL,
    requested_by text        NOT NULL,
    requested_at timestamptz NOT NULL,
    -- The replica that took it, and when; NULL while pending.
    taken_by     text,
    taken_at     timestamptz,
    -- Set when the taker's fire came to an end, with what it came to there
    -- (success, fail, lose: run or done elsewhere, ...); history has the run.
    done_at      timestamptz,
    outcome      text,
    UNIQUE (code, run_key)
);
CREATE INDEX {requests_pending} ON {requests} (requested_at) WHERE done_at IS NULL;
