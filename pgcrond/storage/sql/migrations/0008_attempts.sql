-- Attempt records: what each attempt of a tick left behind, one row per claim
-- that ran (its fencing token names it), beside the tick's lease row, which
-- keeps its meaning. Written as the attempt starts (in the claim's statement)
-- and closed with its finalize; a takeover closes its dead predecessor's as
-- 'lost'. Output is bytes, bounded by the writer (pgcrond.run.output): the
-- head and tail of each stream and how many bytes between them were dropped.
-- Deleted with the lease row they belong to (history pruning).
CREATE TABLE {attempts} (
    lease_id       bigint           NOT NULL REFERENCES {table} (id) ON DELETE CASCADE,
    fencing_token  bigint           NOT NULL,
    attempt        integer          NOT NULL,
    replica        text             NOT NULL,
    started_at     timestamptz      NOT NULL,
    finished_at    timestamptz,
    status         text             NOT NULL,
    error          text,
    exit_code      integer,
    duration_ms    double precision,
    stdout_head    bytea,
    stdout_tail    bytea,
    stdout_dropped bigint,
    stderr_head    bytea,
    stderr_tail    bytea,
    stderr_dropped bigint,
    PRIMARY KEY (lease_id, fencing_token),
    CONSTRAINT {attempts_status_check}
        CHECK (status IN ('running', 'success', 'fail', 'timeout', 'released', 'lost'))
);
