"""One replica's life: start-up, the APScheduler adapter, signals, reload, drain,
HTTP probes, metrics, sd_notify, logging."""
