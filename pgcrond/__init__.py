"""pgcrond: a distributed cron daemon guarded by PostgreSQL."""

__version__ = "0.1.0"
