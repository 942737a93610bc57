"""CronSchedule.next_after agrees with a brute-force reference over random expressions.

The reference shares no code with pgcrond.core.schedule: it expands the generated
fields itself and walks the window instant by instant, asking for each one
"is there a matching wall-clock time whose first (fold=0) reading is this
instant?" — which is the DST rule stated in the module docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcrond.core.schedule import CronSchedule

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC", "Asia/Kolkata"]
MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


@dataclass(frozen=True)
class Spec:
    low: int
    high: int
    names: list[str] | None = None  # names[i] spells low + i


SECOND, MINUTE, HOUR = Spec(0, 59), Spec(0, 59), Spec(0, 23)
DOM, MONTH, DOW = Spec(1, 31), Spec(1, 12, MONTH_NAMES), Spec(0, 7, DAY_NAMES)


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int]


@st.composite
def items(draw: st.DrawFn, spec: Spec) -> Field:
    def spell(value: int) -> str:
        if spec.names and value - spec.low < len(spec.names) and draw(st.booleans()):
            name = spec.names[value - spec.low]
            return draw(st.sampled_from([name, name.upper(), name.title()]))
        return str(value)

    kind = draw(st.sampled_from(["star_step", "value", "range", "range_step"]))
    value = st.integers(spec.low, spec.high)
    if kind == "star_step":
        step = draw(st.integers(1, spec.high - spec.low + 1))
        return Field(f"*/{step}", frozenset(range(spec.low, spec.high + 1, step)))
    if kind == "value":
        v = draw(value)
        return Field(spell(v), frozenset([v]))
    a, b = sorted([draw(value), draw(value)])
    if kind == "range":
        return Field(f"{spell(a)}-{spell(b)}", frozenset(range(a, b + 1)))
    step = draw(st.integers(1, max(1, b - a)))
    return Field(f"{spell(a)}-{spell(b)}/{step}", frozenset(range(a, b + 1, step)))


@st.composite
def fields(draw: st.DrawFn, spec: Spec, star_weight: int = 1) -> Field:
    """Mostly '*' when star_weight is high, so that sparse fields do not empty the window."""
    if draw(st.integers(0, star_weight)) > 0:
        return Field("*", frozenset(range(spec.low, spec.high + 1)))
    parts = draw(st.lists(items(spec), min_size=1, max_size=3))
    return Field(",".join(p.text for p in parts), frozenset().union(*(p.values for p in parts)))


@dataclass(frozen=True)
class Expr:
    seconds: Field | None
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field

    @property
    def text(self) -> str:
        parts = [self.minute, self.hour, self.dom, self.month, self.dow]
        if self.seconds is not None:
            parts.insert(0, self.seconds)
        return " ".join(p.text for p in parts)

    def matches(self, wall: datetime) -> bool:
        seconds = self.seconds.values if self.seconds is not None else {0}
        if not (
            wall.second in seconds
            and wall.minute in self.minute.values
            and wall.hour in self.hour.values
            and wall.month in self.month.values
        ):
            return False
        dom_ok = wall.day in self.dom.values
        dow_values = {d % 7 for d in self.dow.values}
        dow_ok = wall.isoweekday() % 7 in dow_values
        if not self.dom.text.startswith("*") and not self.dow.text.startswith("*"):
            return dom_ok or dow_ok
        return dom_ok and dow_ok


def transitions(zone: ZoneInfo, years: range) -> list[datetime]:
    """UTC instants at which the zone's offset changes (found by scanning, then bisecting)."""
    found = []
    t = datetime(years.start, 1, 1, tzinfo=UTC)
    end = datetime(years.stop, 1, 1, tzinfo=UTC)
    while t < end:
        nxt = t + timedelta(days=1)
        if t.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        t = nxt
    return found


TRANSITIONS = {name: transitions(ZoneInfo(name), range(2024, 2028)) for name in ZONES}


@st.composite
def starts(draw: st.DrawFn, zone_name: str) -> datetime:
    near = TRANSITIONS[zone_name]
    use_near: bool = draw(st.booleans())
    if near and use_near:
        base = draw(st.sampled_from(near))
        offset = draw(st.integers(-4 * 3600, 4 * 3600) | st.integers(-5400, 5400))
    else:
        base = datetime(2024, 1, 1, tzinfo=UTC)
        offset = draw(st.integers(0, 4 * 365 * 86400))
    micro = draw(st.sampled_from([0, 0, 1, 500_000, 999_999]))
    return base + timedelta(seconds=offset, microseconds=micro)


def reference_fires(expr: Expr, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    step = timedelta(seconds=1) if expr.seconds is not None else timedelta(minutes=1)
    offsets = set()
    probe = start - timedelta(days=1)
    while probe < end + timedelta(days=1):
        offsets.add(probe.astimezone(zone).utcoffset())
        probe += timedelta(minutes=30)
    x = (
        start.replace(microsecond=0, second=0)
        if expr.seconds is None
        else start.replace(microsecond=0)
    )
    fires = []
    while x <= end:
        if x > start:
            naive = x.replace(tzinfo=None)
            for offset in offsets:
                assert offset is not None
                wall = naive + offset
                if (
                    expr.matches(wall)
                    and wall.replace(tzinfo=zone).astimezone(UTC) == x  # fold=0 reading
                ):
                    fires.append(x)
                    break
        x += step
    return fires


def implementation_fires(schedule: CronSchedule, start: datetime, end: datetime) -> list[datetime]:
    fires: list[datetime] = []
    t = start
    while True:
        nxt = schedule.next_after(t)
        if nxt is None or nxt > end:
            return fires
        assert nxt > t
        assert nxt.tzinfo is UTC and nxt.microsecond == 0
        fires.append(nxt)
        t = nxt


@st.composite
def five_field(draw: st.DrawFn) -> Expr:
    return Expr(
        seconds=None,
        minute=draw(fields(MINUTE)),
        hour=draw(fields(HOUR)),
        dom=draw(fields(DOM, star_weight=2)),
        month=draw(fields(MONTH, star_weight=4)),
        dow=draw(fields(DOW, star_weight=2)),
    )


@st.composite
def six_field(draw: st.DrawFn) -> Expr:
    return Expr(
        seconds=draw(fields(SECOND)),
        minute=draw(fields(MINUTE, star_weight=2)),
        hour=draw(fields(HOUR, star_weight=3)),
        dom=Field("*", frozenset(range(1, 32))),
        month=Field("*", frozenset(range(1, 13))),
        dow=draw(fields(DOW, star_weight=4)),
    )


def _parses(expr: Expr, zone: ZoneInfo) -> CronSchedule | None:
    try:
        return CronSchedule.parse(expr.text, zone)
    except ValueError as exc:
        # Only "never fires" may be refused among generated (well-formed) expressions.
        assert "never fires" in str(exc), (expr.text, exc)
        return None


def _agrees_over(data: st.DataObject, expr: Expr, zone_name: str, window: timedelta) -> None:
    zone = ZoneInfo(zone_name)
    schedule = _parses(expr, zone)
    if schedule is None:
        return
    start = data.draw(starts(zone_name))
    end = start + window
    assert reference_fires(expr, zone, start, end) == implementation_fires(schedule, start, end)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), expr=five_field(), zone_name=st.sampled_from(ZONES))
def test_five_field_next_after_matches_brute_force(
    data: st.DataObject, expr: Expr, zone_name: str
) -> None:
    """Over a 36 h window, the chain of next_after calls yields exactly the reference ticks."""
    _agrees_over(data, expr, zone_name, timedelta(hours=36))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), expr=six_field(), zone_name=st.sampled_from(ZONES))
def test_six_field_next_after_matches_brute_force(
    data: st.DataObject, expr: Expr, zone_name: str
) -> None:
    """Seconds-first expressions, checked second by second over a 75 min window."""
    _agrees_over(data, expr, zone_name, timedelta(minutes=75))
