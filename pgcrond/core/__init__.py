"""Pure core, no I/O: identities and keys, schedules (cron(8), zones, DST),
durations, lease timing, retry delays, actions, redaction."""
