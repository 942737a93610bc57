"""Operator commands: migrate, status, history, trigger, unlock, prune; check and
next (no database); tables and JSON for people and programs."""
