-- Why each attempt ran (its trigger kind: schedule, manual, backfill, catch_up,
-- retry, takeover), written by the claim that starts it. Records made before
-- this migration have none.
ALTER TABLE {attempts} ADD COLUMN trigger text;
-- A backfill: one job's scheduled ticks over a past range, filed at once as
-- requests (one per tick to run, under the tick's own run key) that the
-- replicas take at most max_parallel at a time.
CREATE TABLE {backfills} (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    code         text        NOT NULL,
    range_from   timestamptz NOT NULL,
    range_to     timestamptz NOT NULL,
    requested_by text        NOT NULL,
    requested_at timestamptz NOT NULL,
    max_parallel integer     NOT NULL CHECK (max_parallel > 0)
);
-- A request says what asked for it (manual: `pgcrond trigger`; backfill),
-- the parameters its run gets as environment variables, and, for a
-- backfill's, the backfill and the tick's place in it (seq: in tick order).
ALTER TABLE {requests}
    ADD COLUMN trigger     text  NOT NULL DEFAULT 'manual'
        CONSTRAINT {requests_trigger_check} CHECK (trigger IN ('manual', 'backfill')),
    ADD COLUMN params      jsonb,
    ADD COLUMN backfill_id bigint REFERENCES {backfills} (id) ON DELETE CASCADE,
    ADD COLUMN seq         integer;
CREATE INDEX {requests_backfill} ON {requests} (backfill_id, seq) WHERE backfill_id IS NOT NULL;
