-- One row per job under concurrency: forbid, inserted by its first claim and
-- never written again: each claim of the job's ticks locks it (forbid_lock),
-- so they are serialised across replicas. A row lock lives in the row, not in
-- PostgreSQL's shared lock table, where an advisory lock per job took a slot
-- each until commit: 10,000 co-firing jobs ran the default table (64 x
-- max_connections) out of shared memory, for every application on the server.
CREATE TABLE {forbid_rows} (
    code text PRIMARY KEY
);
