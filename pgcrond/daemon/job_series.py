"""Metric families with a series per job, kept as plain numbers and rendered as text directly.

prometheus_client keeps each labelled child as an object with its own lock
and renders every sample through a namedtuple and several escapes: at 10,000
jobs the per-job families were 80 MB of a replica's memory and a second of
CPU per scrape (on a thread, but holding the GIL against the loop). Here a
series is a float and its label values, escaped once when it is created (the
key itself when nothing needed escaping: no copy); a render formats each line
from its family's template (tens of ms at 10,000 jobs). A line kept per series
was 15 MB of 10,000 jobs' 120,000 series.

The API is the part of prometheus_client's that pgcrond uses (``labels(...)``
then ``inc``/``dec``/``set``, ``remove``), so call sites read the same. Only
the loop writes; a render on a worker thread reads a snapshot of the series
(taken in one C call, under the GIL) and values that are single floats.

A series that exists at 0 from the start (a job's fires, its runs by outcome)
is no object until its first event: the family holds the jobs' codes (one
mapping shared by every family) and the label values after the code, and a
render writes 0 for each pair without a series of its own. At 100,000 jobs
the 13 series each were 170 bytes a series, 220 MiB of a replica at rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, Protocol

Kind = Literal["counter", "gauge"]


def escape_label(value: str) -> str:
    """A label value as the text formats quote it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Rendered(Protocol):
    """Metric families that write their own text (appended to prometheus_client's)."""

    def render(self, openmetrics: bool) -> str:
        """The families in the text format (0.0.4), or in OpenMetrics's."""
        ...


def gauge_text(name: str, documentation: str, samples: Iterable[tuple[str, float]]) -> str:
    """A gauge family labelled by ``cronjob`` alone, its samples computed at scrape time.

    A gauge reads the same in both text formats. prometheus_client's
    OpenMetrics writer tests every character of every label value: at 10,000
    jobs the alert gauges and the next fires, 50,000 samples, were 0.3 s of
    each scrape that way.
    """
    head = f"# HELP {name} {_escape_help(documentation)}\n# TYPE {name} gauge\n"
    line = f'{name}{{cronjob="%s"}} '
    return head + "".join([f"{line % escape_label(code)}{value!r}\n" for code, value in samples])


class Series:
    """One series: its value and its label values, escaped for the text format."""

    __slots__ = ("labels", "value")

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class JobFamily:
    """A counter or gauge family whose first label is ``cronjob``."""

    def __init__(
        self, name: str, documentation: str, kind: Kind, labelnames: Iterable[str]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.kind = kind
        self.labelnames = tuple(labelnames)
        # A counter's samples end in _total (prometheus_client's naming).
        self._sample = f"{name}_total" if kind == "counter" else name
        # A sample line up to its value, %-formatted with the series' labels
        # (metric and label names never hold a "%": [a-zA-Z0-9_:]).
        pairs = ",".join(f'{n}="%s"' for n in self.labelnames)
        self._line = f"{self._sample}{{{pairs}}} "
        self._series: dict[tuple[str, ...], Series] = {}
        # The series present at 0 before their first event: each job (code ->
        # its escaped code) with each of these label values after the code,
        # escaped. Replaced whole, never changed in place: a render reads them
        # on a worker thread.
        self._jobs: Mapping[str, str] = {}
        self._rests: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()

    def labels(self, *values: str, **by_name: str) -> Series:
        """The series for these label values (positional, or by name), made on first use."""
        key = values if values else tuple(by_name[n] for n in self.labelnames)
        series = self._series.get(key)
        if series is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            escaped = tuple(escape_label(v) for v in key)
            # Nothing escaped (nearly always): the key itself, not a copy of it.
            series = self._series[key] = Series(key if escaped == key else escaped)
        return series

    def present(self, jobs: Mapping[str, str], *rests: tuple[str, ...]) -> None:
        """Each job (code -> its escaped code) has a series with each ``rests``, at 0 until set.

        A config's jobs at start and at each reload. No series is made: a
        render writes the zeros (one object per series was most of a replica's
        memory at rest), and :meth:`labels` makes a series on its first event.
        """
        for rest in rests:
            if len(rest) + 1 != len(self.labelnames):
                raise ValueError(
                    f"{self.name}: expected labels {self.labelnames}, got {rest} after"
                )
        self._rests = tuple((rest, tuple(escape_label(v) for v in rest)) for rest in rests)
        self._jobs = jobs

    def remove(self, *values: str) -> None:
        self._series.pop(tuple(values), None)

    def label_sets(self) -> list[tuple[str, ...]]:
        """The label values of the series made so far (not those at 0 from :meth:`present`)."""
        return list(self._series)

    def render(self, openmetrics: bool) -> str:
        """The family in the text format (0.0.4), or in OpenMetrics's."""
        # OpenMetrics names a counter family without its _total suffix.
        family = self.name if openmetrics or self.kind == "gauge" else self._sample
        head = f"# HELP {family} {_escape_help(self.documentation)}\n# TYPE {family} {self.kind}\n"
        # One C call each: a snapshot, whatever the loop does.
        made = dict(self._series)
        jobs, rests = self._jobs, self._rests
        line = self._line
        lines = []
        for rest, escaped in rests:
            for code, label in jobs.items():
                series = made.pop((code, *rest), None)
                if series is None:
                    lines.append(f"{line % (label, *escaped)}0.0\n")
                else:
                    lines.append(f"{line % series.labels}{series.value!r}\n")
        lines += [f"{line % s.labels}{s.value!r}\n" for s in made.values()]
        return head + "".join(lines)
