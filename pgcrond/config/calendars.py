"""``calendars:``: named lists of days off, each read with the line of every wrong day.

A calendar lists ``days:`` (dates and ``first..last`` ranges), ``yearly:``
dates (``MM-DD``) and may ``include:`` a YAML file of the same two keys, so
that teams share one list of holidays; its path is read from the directory
of the file that names it.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import yaml

from pgcrond.config.fields import CALENDAR_KEYS
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Located, Section, compose, kind, mapping_expected
from pgcrond.core.schedule.calendars import Calendar, parse_day, parse_yearly

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}$")


def read_calendars(reading: Reading, located: Located | None) -> dict[str, Calendar]:
    """Every calendar of the ``calendars:`` section (None: no section); problems reported."""
    if located is None:
        return {}
    if not isinstance(located.node, yaml.MappingNode):
        reading.issue(located.file, located.line, None, "calendars", mapping_expected(located.node))
        return {}
    calendars: dict[str, Calendar] = {}
    for key, value in reading.issues.pairs(located, None, "calendars"):
        name = str(key.node.value)
        if not _NAME.match(name):
            reading.issue(
                key.file,
                key.line,
                None,
                f"calendars.{name}",
                "a calendar's name is 1-63 letters, digits, '_' or '-' (a skipped tick "
                "is marked calendar:<name>)",
            )
            continue
        prefix = f"calendars.{name}."
        section = reading.issues.section(value, key.line, None, prefix, CALENDAR_KEYS)
        if section is None:
            continue
        spans: list[tuple[date, date]] = []
        yearly: list[tuple[int, int]] = []
        _read_days(reading, section, spans, yearly)
        if "include" in section.values:
            _include(reading, section, spans, yearly)
        calendars[name] = Calendar.build(name, spans, yearly)
    return calendars


def _read_days(
    reading: Reading,
    section: Section,
    spans: list[tuple[date, date]],
    yearly: list[tuple[int, int]],
) -> None:
    for field, parse, into in (
        ("days", parse_day, spans),
        ("yearly", parse_yearly, yearly),
    ):
        located = section.values.get(field)
        if located is None:
            continue
        if not isinstance(located.node, yaml.SequenceNode):
            reading.report(section, field, f"must be a list, got {kind(located.node)}")
            continue
        for index, item in enumerate(located.node.value):
            line = int(item.start_mark.line) + 1
            if not isinstance(item, yaml.ScalarNode):
                message = f"entry {index}: expected a date, got {kind(item)}"
                reading.issue(located.file, line, None, section.prefix + field, message)
                continue
            try:
                into.append(parse(str(item.value)))  # type: ignore[arg-type]
            except ValueError as exc:
                message = f"entry {index}: {exc}"
                reading.issue(located.file, line, None, section.prefix + field, message)


def _include(
    reading: Reading,
    section: Section,
    spans: list[tuple[date, date]],
    yearly: list[tuple[int, int]],
) -> None:
    located = section.values["include"]
    if not isinstance(located.node, yaml.ScalarNode) or not str(located.node.value).strip():
        reading.report(section, "include", "must be the path of a YAML file of days and yearly")
        return
    path = Path(str(located.node.value))
    if not path.is_absolute() and not located.file.startswith("<"):
        path = Path(located.file).parent / path
    try:
        root = compose(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        reading.report(section, "include", f"cannot read {str(path)!r}: {exc}")
        return
    except yaml.YAMLError as exc:
        reading.report(section, "include", f"{str(path)!r}: YAML syntax error: {exc}")
        return
    if root is None:
        return
    included = reading.issues.section(
        Located(str(path), root), 1, None, section.prefix, ("days", "yearly")
    )
    if included is not None:
        _read_days(reading, included, spans, yearly)
