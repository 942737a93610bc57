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
last, so a DSN in a driver's message never reaches the log with its password,
and through :func:`pgcrond.core.output.safe`, so no control or bidi character
of a job's output reaches a terminal raw, in either format.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, TextIO

import orjson
import structlog
from structlog.types import EventDict, Processor, WrappedLogger

from pgcrond.core.output import safe
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


def _clean(text: str) -> str:
    """``text`` redacted, and safe on a terminal: control and bidi characters escaped
    (an ESC sequence in a job's output would retitle or clear the operator's terminal,
    a U+202E reorder what it shows), as ``pgcrond logs`` and the status page show them."""
    text = redact(text)
    # isprintable(): False for every character safe() escapes (and for newlines
    # and tabs, which it keeps); a C-speed look at most values.
    return text if text.isprintable() else safe(text)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return _clean(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(item) for item in value]
    # Anything else would be rendered through its repr (an exception object, a
    # conninfo): render it here, so the redaction sees the text that is logged.
    return _clean(str(value))


# Values that carry no text: passed as they are.
_PLAIN = frozenset({int, float, bool, type(None)})


def redact_values(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Every value of the event, nested ones too, with passwords replaced by ``***`` and
    control characters escaped."""
    # In place (a key's value replaced, none added): a run says two lines,
    # and a new dict per line was a tenth of a line's cost.
    for key, value in event_dict.items():
        kind = type(value)
        if kind is str:
            # Most values: redacted here, not through _redacted's dispatch
            # (half of this processor's cost at two lines a run).
            event_dict[key] = _clean(value)
        elif kind not in _PLAIN:
            event_dict[key] = _redacted(value)
    return event_dict


class _Stamp:
    """The line's time, ISO 8601 in UTC to the microsecond (``…T09:35:50.677217Z``).

    structlog's ``TimeStamper`` formats a datetime per line; here the date and
    time of the current second are formatted once per second. Set as one
    tuple, so threads (the libraries' lines) never see half of an update.
    """

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        now = time.time()
        second, prefix = self._second
        if int(now) != second:
            second = int(now)
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        event_dict["timestamp"] = f"{prefix}.{int((now - second) * 1_000_000):06d}Z"
        return event_dict


# The standard library's encoder, for what orjson refuses (an integer past
# 64 bits): one instance, since json.dumps with an argument builds one per call.
_ENCODER = json.JSONEncoder(default=repr)


def _json_line(event_dict: EventDict, **_: Any) -> str:
    """The line as compact JSON, non-ASCII as UTF-8; every value is plain by now.

    orjson, a tenth of the standard encoder's time: a line is rendered on
    the loop, two for every run.
    """
    try:
        return orjson.dumps(event_dict, default=repr).decode()
    except orjson.JSONEncodeError:
        return _ENCODER.encode(event_dict)


def _exc_info(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """A traceback as a string field; a line without one (nearly all) passes untouched."""
    if "exc_info" in event_dict:
        return structlog.processors.format_exc_info(logger, name, event_dict)
    return event_dict


def _shared_processors() -> list[Processor]:
    """What every line gets, pgcrond's own and the libraries' alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _Stamp(),
        structlog.processors.StackInfoRenderer(),
    ]


# A loop turn's lines leave together; past this many they go at once, so a
# turn that says a great deal holds no unbounded buffer.
_TURN_LINES = 1000


class _Lines:
    """The stream's one writer: whole lines, under one lock, in the order they were said.

    A line said on a running event loop waits for the end of the loop's turn
    and leaves with that turn's other lines in one write: a 10,000-job tick
    says 20,000 lines, and a write and a flush for each was a twelfth of the
    loop's time. A line said anywhere else (a library's thread, before the
    loop starts or after it ends) first writes out what waits, then itself;
    so does the process's exit. A kill -9 can lose the lines of the turn it
    interrupts, no more.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._waiting: list[str] = []
        # The loop a flush is queued on, if any: one flush per turn.
        self._flush_on: asyncio.AbstractEventLoop | None = None
        atexit.register(self.flush)

    def write(self, line: str) -> None:
        """Write ``line`` (ending in a newline) now, or at the end of this loop turn."""
        loop = asyncio.events._get_running_loop()
        with self._lock:
            self._waiting.append(line)
            if loop is not None and len(self._waiting) < _TURN_LINES:
                if self._flush_on is loop:
                    return
                if not loop.is_closed():
                    loop.call_soon(self.flush)
                    self._flush_on = loop
                    return
            self._write_waiting()

    def flush(self) -> None:
        """Write out every line that waits."""
        with self._lock:
            self._write_waiting()

    def _write_waiting(self) -> None:
        self._flush_on = None
        if not self._waiting:
            return
        text = "".join(self._waiting)
        self._waiting.clear()
        # A closed or broken stderr has nowhere to put the lines: they are
        # dropped, and whatever logged goes on.
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
            self._stream.flush()


class _StreamHandler(logging.Handler):
    """Our handler on the root logger, recognisable so ``configure`` can replace it.

    It writes through the same :class:`_Lines` as pgcrond's own lines.
    """

    def __init__(self, lines: _Lines) -> None:
        super().__init__()
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        self._lines.flush()

    def close(self) -> None:
        # Replaced by a later configure(): what waits is written now, not at exit.
        self._lines.flush()
        atexit.unregister(self._lines.flush)
        super().close()


class _Named:
    """structlog's logger for pgcrond's own lines, named like a stdlib logger (``logger``)."""

    def __init__(self, name: str, lines: _Lines) -> None:
        self.name = name
        self._write = lines.write

    def msg(self, message: str) -> None:
        self._write(message + "\n")

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


class _NamedFactory:
    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def __call__(self, *args: Any) -> _Named:
        return _Named(str(args[0]) if args else "pgcrond", self._lines)


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
        renderer = structlog.processors.JSONRenderer(serializer=_json_line)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=use_color(color, stream.isatty()))
    threshold = logging.getLevelNamesMapping()[level.upper()]

    lines = _Lines(stream)
    handler = _StreamHandler(lines)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                # A traceback becomes a string field before redaction sees it
                # (one escaped JSON string; plain lines on the console).
                _exc_info,
                redact_values,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StreamHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(threshold)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(threshold, LIBRARY_FLOOR))
    # warnings.warn(...) -> the "py.warnings" logger -> the handler above.
    logging.captureWarnings(True)

    structlog.configure(
        processors=[
            *_shared_processors(),
            _exc_info,
            redact_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_NamedFactory(lines),
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
