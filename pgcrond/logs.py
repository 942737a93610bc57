"""One log stream: every line the process writes goes through structlog's processors.

A log line is an event name plus key-value context
(``log.info("run_finished", job=..., run_key=..., outcome=...)``). Per-run
context is bound once with contextvars by the daemon.

pgcrond's own loggers take structlog's fast path: a bound logger that drops
below-level calls at no cost, and processors that render straight onto
stderr (no ``logging.LogRecord``, no handler chain: a run logs on the loop).
The libraries' stdlib loggers (psycopg, psycopg_pool, APScheduler, asyncio),
Python ``warnings`` and uncaught exceptions end in one stdlib handler whose
:class:`structlog.stdlib.ProcessorFormatter` runs the same processors. Both
write whole lines through one structlog writer per stream, under its one
lock, so lines of the two never interleave: one JSON object per line off a
terminal (a traceback is a field, not extra lines), the console renderer on
one, and every value passed through :func:`pgcrond.core.redaction.redact`
last, so a DSN in a driver's message never reaches the log with its password.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, TextIO

import structlog
from structlog.types import EventDict, Processor, WrappedLogger

from pgcrond.core.redaction import redact

LogFormat = Literal["auto", "json", "console"]
ColorChoice = Literal["auto", "always", "never"]

# https://no-color.org: set and not empty turns colour off; --color always wins.
NO_COLOR_ENV = "NO_COLOR"

# Libraries log below WARNING about their normal work (psycopg_pool: every
# connection handed out); pgcrond's own events say what matters. Their warnings
# and errors (a failed connection attempt) always come through.
# httpx and httpcore too: their info and debug lines quote a request's URL
# with its query values, and responses' headers and reason phrases (which
# may echo a request's secret); pgcrond logs its own, redacted, lines.
LIBRARY_LOGGERS = ("psycopg", "apscheduler", "asyncio", "httpx", "httpcore")
LIBRARY_FLOOR = logging.WARNING


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(item) for item in value]
    # Anything else would be rendered through its repr (an exception object, a
    # conninfo): render it here, so the redaction sees the text that is logged.
    return redact(str(value))


def redact_values(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Every value of the event, nested ones too, with passwords replaced by ``***``."""
    return {key: _redacted(value) for key, value in event_dict.items()}


def _shared_processors() -> list[Processor]:
    """What every line gets, pgcrond's own and the libraries' alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


class _StreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Our handler on the root logger, recognisable so ``configure`` can replace it.

    It writes through structlog's writer for the same stream, whose lock
    pgcrond's own lines take too.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._out = structlog.WriteLogger(stream)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._out.msg(self.format(record))
        except Exception:
            self.handleError(record)


class _Named(structlog.WriteLogger):
    """structlog's line writer, named like a stdlib logger (the ``logger`` field)."""

    def __init__(self, name: str, file: TextIO) -> None:
        super().__init__(file)
        self.name = name


class _NamedFactory:
    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _Named:
        return _Named(str(args[0]) if args else "pgcrond", self._file)


def use_color(choice: ColorChoice, isatty: bool) -> bool:
    """``auto``: colour on a terminal unless ``NO_COLOR`` is set (to anything but empty)."""
    if choice != "auto":
        return choice == "always"
    return isatty and not os.environ.get(NO_COLOR_ENV)


def configure(fmt: LogFormat = "auto", level: str = "info", color: ColorChoice = "auto") -> None:
    """Route structlog, stdlib logging, warnings and uncaught exceptions to stderr."""
    stream = sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer: Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=use_color(color, stream.isatty()))
    threshold = logging.getLevelNamesMapping()[level.upper()]

    handler = _StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                # A traceback becomes a string field before redaction sees it
                # (one escaped JSON string; plain lines on the console).
                structlog.processors.format_exc_info,
                redact_values,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StreamHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(threshold, LIBRARY_FLOOR))
    # warnings.warn(...) -> the "py.warnings" logger -> the handler above.
    logging.captureWarnings(True)

    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.processors.format_exc_info,
            redact_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_NamedFactory(stream),
        cache_logger_on_first_use=True,
    )
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


_log = structlog.get_logger("pgcrond")


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    # The interpreter would print the traceback as bare lines on stderr.
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    _log.critical("uncaught_exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None:
        return
    _log.critical(
        "uncaught_exception",
        thread=args.thread.name if args.thread is not None else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
