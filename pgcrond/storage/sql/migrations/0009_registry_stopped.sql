-- A clean stop keeps the replica's row, marked stopped, so that `pgcrond plan`
-- with every replica stopped (a deploy that stops all, then starts the new
-- version) compares against the config the cluster last ran. Stopped and gone
-- rows are deleted by a replica's join once not seen for KEEP_STOPPED
-- (storage/registry.py). NULL: running (or died without saying so).
ALTER TABLE {replicas} ADD COLUMN stopped_at timestamptz;
