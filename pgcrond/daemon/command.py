"""``pgcrond run``: the command line's way into one replica (:class:`Daemon`)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys

import structlog

from pgcrond.config.loader import load_config
from pgcrond.daemon import interpreter
from pgcrond.daemon.lifecycle import Daemon
from pgcrond.errors import ConfigError, ExitCode, PgcrondError
from pgcrond.logs import configure

log = structlog.get_logger("pgcrond.daemon.command")


def run_command(args: argparse.Namespace) -> int:
    """``pgcrond run``: exit 2 on a bad config (all errors printed), 0 after a clean stop,
    130 after a second SIGINT cut the drain short."""
    configure(args.log_format, args.log_level, args.color)
    interpreter.tune()
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # A load makes millions of objects and no cycle worth chasing: the
    # collector would walk the growing YAML tree again and again (a quarter of
    # a 100,000-job load). What it left is collected once the daemon settles.
    gc.disable()
    try:
        config = load_config(args.config, database_url=args.database_url, listen=args.http)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        print(
            "pgcrond did not start: fix these and run `pgcrond check` to verify.", file=sys.stderr
        )
        return ExitCode.ERROR
    finally:
        gc.enable()
    try:
        # Inside: a PGCROND_REPLICA that cannot name a replica is refused here.
        daemon = Daemon(
            config,
            args.config,
            database_url=args.database_url,
            replica=args.replica,
        )
        # The daemon's own loop: its stall probe times the loop's turns.
        with asyncio.Runner(loop_factory=daemon.new_loop) as runner:
            return runner.run(daemon.run())
    except PgcrondError as exc:
        log.error("daemon_failed", error=str(exc))
        return ExitCode.FAILED
