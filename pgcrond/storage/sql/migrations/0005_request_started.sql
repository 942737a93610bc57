-- When the taker's run of a request started. A guard that remembers nothing
-- (advisory) cannot say whether a run finished: a request retaken with this
-- set and done_at NULL is not run again but closed with outcome 'unknown'.
ALTER TABLE {requests} ADD COLUMN started_at timestamptz;
