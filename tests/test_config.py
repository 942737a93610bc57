"""The config loader: values, defaults, precedence, and an issue per mistake with its place."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pgcrond.config.loader import load_config
from pgcrond.config.models import DatabaseConfig, PruneRule, min_history_retention, prune_rules
from pgcrond.core.actions import CommandAction, EntrypointAction, ShellAction
from pgcrond.core.redaction import redact
from pgcrond.core.schedule import AtSchedule, CronSchedule, OnceSchedule
from pgcrond.errors import ConfigError, ConfigIssue

EMBEDDED = "database: {embedded: true}\n"
HELLO = 'jobs:\n  hello:\n    cron: "* * * * *"\n    command: [/bin/echo, hi]\n'


def write(tmp_path: Path, text: str, name: str = "pgcrond.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def issues_of(path: Path | list[Path], **kwargs: object) -> list[ConfigIssue]:
    paths = path if isinstance(path, list) else [path]
    with pytest.raises(ConfigError) as raised:
        load_config(paths, environ={}, **kwargs)  # type: ignore[arg-type]
    return list(raised.value.issues)


def only_issue(path: Path, **kwargs: object) -> ConfigIssue:
    issues = issues_of(path, **kwargs)
    assert len(issues) == 1, issues
    return issues[0]


# --- a valid file ----------------------------------------------------------------


def test_a_full_job_definition_is_read_with_defaults_applied(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        database: {embedded: true}
        defaults:
          timezone: Europe/Berlin
          retries: 2
          env: {A: "1", B: "1"}
        jobs:
          nightly:
            description: the nightly report
            cron: "30 2 * * *"
            command: ["/bin/echo", "hi"]
            lease: 1m
            timeout: 5m
            env: {B: "2"}
            cwd: /tmp
          script:
            cron: "@hourly"
            shell: "date | true"
            timezone: UTC
            concurrency: allow
          py:
            once: true
            entrypoint: "os.path:join"
            isolate: true
          locked:
            at: "2030-01-01T00:00:00"
            guard: advisory
            key_hash: nestjs-pg-cron-lock
            lock_key: 42
            command: ["true"]
        """,
    )
    config = load_config([path], environ={})
    assert list(config.jobs) == ["nightly", "script", "py", "locked"]
    nightly = config.jobs["nightly"]
    assert isinstance(nightly.schedule, CronSchedule)
    assert nightly.schedule.zone == ZoneInfo("Europe/Berlin")
    assert nightly.action == CommandAction(("/bin/echo", "hi"))
    assert nightly.timing.lease == timedelta(minutes=1)
    assert nightly.timing.heartbeat == timedelta(seconds=20)  # min(60s, lease/3)
    assert nightly.timeout == timedelta(minutes=5)
    assert nightly.retries == 2
    assert dict(nightly.env) == {"A": "1", "B": "2"}
    assert nightly.cwd == Path("/tmp")
    assert nightly.lock_key == "nightly"
    assert nightly.description == "the nightly report"
    assert nightly.source == f"{path}:7"
    assert nightly.concurrency == "forbid"
    assert nightly.guard == "lease"
    script = config.jobs["script"]
    assert script.action == ShellAction("date | true")
    assert script.timezone == ZoneInfo("UTC")
    assert script.concurrency == "allow"
    py = config.jobs["py"]
    assert isinstance(py.schedule, OnceSchedule) and py.is_once
    assert py.action == EntrypointAction("os.path:join", isolate=True)
    locked = config.jobs["locked"]
    # A naive `at` is read in the job's zone: Berlin, winter (+01:00).
    assert locked.schedule == AtSchedule(datetime(2029, 12, 31, 23, tzinfo=UTC))
    assert (locked.guard, locked.key_hash, locked.lock_key) == (
        "advisory",
        "nestjs-pg-cron-lock",
        42,
    )
    assert config.http_listen == "127.0.0.1:9464"
    assert config.shutdown_grace == timedelta(seconds=30)
    assert config.history_retention == timedelta(days=30)
    assert config.database == DatabaseConfig(url=None, embedded=True)
    assert config.files == (str(path),)


def test_top_level_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + 'http: {listen: ""}\nshutdown_grace: 2m\nhistory_retention: 7d\n' + HELLO,
    )
    config = load_config([path], environ={})
    assert config.http_listen == ""
    assert config.shutdown_grace == timedelta(minutes=2)
    assert config.history_retention == timedelta(days=7)


def test_yaml_merge_keys_share_settings_between_jobs(tmp_path: Path) -> None:
    """Keys written in the job win over merged ones, without a duplicate-key issue."""
    path = write(
        tmp_path,
        EMBEDDED
        + textwrap.dedent(
            """\
        jobs:
          a: &base
            timezone: Asia/Kolkata
            cron: "0 9 * * *"
            command: ["true"]
          b:
            <<: *base
            cron: "0 10 * * *"
        """
        ),
    )
    jobs = load_config([path], environ={}).jobs
    assert jobs["b"].timezone == ZoneInfo("Asia/Kolkata")
    assert jobs["b"].schedule.describe() == "cron '0 10 * * *': at 10:00 every day (Asia/Kolkata)"
    assert jobs["b"].source == f"{path}:7"


def test_a_job_can_carry_a_problem_and_another_one_too(tmp_path: Path) -> None:
    """An unknown key and the schedule it was meant to be are both reported."""
    path = write(tmp_path, EMBEDDED + 'jobs:\n  j:\n    crn: "* * * * *"\n    command: ["true"]\n')
    issues = issues_of(path)
    assert [(i.field, i.line) for i in issues] == [("schedule", 3), ("crn", 4)]
    assert "did you mean 'cron'?" in issues[1].message


# --- database ----------------------------------------------------------------------


def test_url_interpolates_environment_variables(tmp_path: Path) -> None:
    path = write(tmp_path, 'database: {url: "postgresql://${USER_}:${PW:-x}@db/${NAME}"}\n' + HELLO)
    config = load_config([path], environ={"USER_": "app", "NAME": "cron"})
    assert config.database.url == "postgresql://app:x@db/cron"
    assert not config.database.embedded


def test_an_undefined_variable_is_an_issue_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "database:\n  url: ${PGCROND_DB}\n" + HELLO)
    issue = only_issue(path)
    assert (issue.file, issue.line, issue.job, issue.field) == (str(path), 2, None, "database.url")
    assert "environment variable PGCROND_DB is not set" in issue.message


def test_database_url_precedence_is_flag_then_env_then_file(tmp_path: Path) -> None:
    path = write(tmp_path, "database: {url: postgresql://file/db}\n" + HELLO)
    env = {"PGCROND_DATABASE_URL": "postgresql://env/db"}
    assert load_config([path], environ={}).database.url == "postgresql://file/db"
    assert load_config([path], environ=env).database.url == "postgresql://env/db"
    flagged = load_config([path], environ=env, database_url="postgresql://flag/db")
    assert flagged.database.url == "postgresql://flag/db"


def test_an_override_url_replaces_embedded_and_unset_file_variables(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + HELLO)
    config = load_config([path], environ={"PGCROND_DATABASE_URL": "postgresql://env/db"})
    assert (config.database.url, config.database.embedded) == ("postgresql://env/db", False)
    path = write(tmp_path, "database: {url: '${MISSING}'}\n" + HELLO, "b.yaml")
    assert load_config([path], environ={}, database_url="postgresql://f/db").database.url


def test_no_database_is_an_issue_saying_how_to_set_one(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, HELLO))
    assert issue.field == "database"
    assert "set database.url" in issue.message and "embedded: true" in issue.message


def test_url_and_embedded_together_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "database: {url: postgresql://h/db, embedded: true}\n" + HELLO)
    assert "not both" in only_issue(path).message


@pytest.mark.parametrize("key", ["schema", "table"])
def test_schema_and_table_must_be_plain_identifiers(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, f'database: {{embedded: true, {key}: "Bad-Name"}}\n' + HELLO)
    issue = only_issue(path)
    assert (issue.field, issue.line) == (f"database.{key}", 1)
    assert "not a plain SQL identifier" in issue.message


def test_password_is_redacted_in_repr_and_redacted_url() -> None:
    database = DatabaseConfig(url="postgresql://app:s3cret@db:5432/cron?sslmode=require")
    assert database.redacted_url == "postgresql://app:***@db:5432/cron?sslmode=require"
    assert "s3cret" not in repr(database)
    assert redact("host=db password=s3cret user=app") == "host=db password=*** user=app"
    assert redact("postgresql://db/cron?password=s3cret") == "postgresql://db/cron?password=***"
    assert redact("postgresql://app@db/cron") == "postgresql://app@db/cron"


# --- files and directories ---------------------------------------------------------------


def test_a_directory_contributes_its_yaml_files_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path, EMBEDDED, "00-base.yaml")
    write(tmp_path, 'jobs:\n  b:\n    once: true\n    command: ["true"]\n', "20-b.yml")
    write(tmp_path, 'jobs:\n  a:\n    once: true\n    command: ["true"]\n', "10-a.yaml")
    write(tmp_path, "not: yaml: [", "notes.txt")
    config = load_config([tmp_path], environ={})
    assert list(config.jobs) == ["a", "b"]
    assert [Path(f).name for f in config.files] == ["00-base.yaml", "10-a.yaml", "20-b.yml"]


def test_duplicate_job_codes_across_files_name_both_places(tmp_path: Path) -> None:
    first = write(tmp_path, EMBEDDED + HELLO, "a.yaml")
    second = write(tmp_path, "\n" + HELLO, "b.yaml")
    issue = only_issue(tmp_path)
    assert (issue.file, issue.line, issue.job) == (str(second), 3, "hello")
    assert f"first at {first}:3" in issue.message and f"again at {second}:3" in issue.message


def test_a_duplicate_job_code_within_one_file_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + HELLO + '  hello:\n    once: true\n    command: ["true"]\n')
    issue = only_issue(path)
    assert (issue.job, issue.line) == ("hello", 6)
    assert "defined twice" in issue.message


def test_top_level_sections_other_than_jobs_live_in_one_file(tmp_path: Path) -> None:
    write(tmp_path, EMBEDDED + HELLO, "a.yaml")
    second = write(tmp_path, EMBEDDED, "b.yaml")
    issue = only_issue(tmp_path)
    assert (issue.file, issue.line, issue.field) == (str(second), 1, "database")
    assert "may appear in one file only" in issue.message


def test_missing_paths_and_empty_directories_are_issues(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    issues = issues_of([tmp_path / "nope.yaml", empty])
    assert [i.message for i in issues][:2] == [
        "no such file or directory",
        "directory has no *.yaml or *.yml file",
    ]


def test_yaml_syntax_errors_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + "jobs:\n  a: [unclosed\n")
    issue = only_issue(path)
    assert issue.file == str(path) and issue.line is not None
    assert issue.message.startswith("YAML syntax error")


def test_no_jobs_at_all_is_an_issue(tmp_path: Path) -> None:
    assert "no jobs defined" in only_issue(write(tmp_path, EMBEDDED)).message


# --- one issue per mistake, each located ----------------------------------------------------


def job_issue(tmp_path: Path, body: str, *, prelude: str = EMBEDDED) -> ConfigIssue:
    """The single issue of a job 'j' whose definition lines are ``body``."""
    indented = textwrap.indent(textwrap.dedent(body), "    ")
    path = write(tmp_path, prelude + "jobs:\n  j:\n" + indented)
    return only_issue(path)


@pytest.mark.parametrize(
    ("body", "field", "line", "message"),
    [
        (
            'cron: "* * * * *"\ncommand: ["true"]\ndescripton: x',
            "descripton",
            6,
            "unknown key 'descripton'; did you mean 'description'?",
        ),
        ('cron: "* * * * *"\ncommand: ["true"]\nzzz: 1', "zzz", 6, "allowed: cron, every, phase"),
        ('cron: "* * * * 8"\ncommand: ["true"]', "cron", 4, "day-of-week: 8 is out of range 0-7"),
        ('cron: "0 0 30 2 *"\ncommand: ["true"]', "cron", 4, "never fires"),
        ('cron: 5\ncommand: ["true"]', "cron", 4, "must be text, got a number (5)"),
        (
            'cron: "* * * * *"\ntimezone: Europe/Berln\ncommand: ["true"]',
            "timezone",
            5,
            "unknown time zone 'Europe/Berln'; use an IANA name, did you mean 'Europe/Berlin'?",
        ),
        ('cron: "* * * * *"\nentrypoint: "no_such_mod_xyz:f"', "entrypoint", 5, "cannot import"),
        ('cron: "* * * * *"\nentrypoint: "os:no_such_attr"', "entrypoint", 5, "has no"),
        ('cron: "* * * * *"\nentrypoint: "not-registered"', "entrypoint", 5, "no entry point"),
        (
            'cron: "* * * * *"\ncommand: ["true"]\nshell: "true"',
            "shell",
            6,
            "has command and shell; a job has exactly one action",
        ),
        ('cron: "* * * * *"', "action", 3, "no action: add one of command"),
        (
            'cron: "* * * * *"\nonce: true\ncommand: ["true"]',
            "once",
            5,
            "has cron and once; a job has exactly one schedule",
        ),
        ('command: ["true"]', "schedule", 3, "no schedule: add one of cron"),
        ("once: false\ncommand: ['true']", "once", 4, "once: false is no schedule"),
        ("at: tomorrow\ncommand: ['true']", "at", 4, "'tomorrow' is not an ISO datetime"),
        ("once: true\ncommand: /bin/echo hi", "command", 5, "must be a list of arguments"),
        ("once: true\ncommand: [/bin/echo, 5]", "command", 5, "argument 1 must be text"),
        ("once: true\ncommand: []", "command", 5, "must name a program"),
        ("once: true\nshell: ''", "shell", 5, "must not be empty"),
        ("once: true\ncommand: ['true']\nlease: 1m\nheartbeat: 30s", "heartbeat", 7, "lease/2"),
        ("once: true\ncommand: ['true']\nlease: 1ms", "lease", 6, "longer than 2ms"),
        ("once: true\ncommand: ['true']\ntimeout: 10 minutes", "timeout", 6, "cannot read"),
        ("once: true\ncommand: ['true']\ntimeout: 0", "timeout", 6, "longer than 0"),
        ("once: true\ncommand: ['true']\nretries: -1", "retries", 6, "whole number 0 or more"),
        ("once: true\ncommand: ['true']\nretries: yes", "retries", 6, "got a boolean (true)"),
        ("once: true\ncommand: ['true']\nguard: leas", "guard", 6, "'leas' is not one of: lease"),
        ("once: true\ncommand: ['true']\nconcurrency: 2", "concurrency", 6, "is not one of"),
        ("once: true\ncommand: ['true']\nenv: {PORT: 8080}", "env", 6, "PORT: must be text"),
        ("once: true\ncommand: ['true']\nenv: [A]", "env", 6, "must be a mapping"),
        ("once: true\ncommand: ['true']\nlock_key: x", "lock_key", 6, "only used with guard"),
        ("once: true\ncommand: ['true']\nisolate: true", "isolate", 6, "only used with entrypoint"),
        ("once: true\ncommand: ['true']\nmin_hold: true", "min_hold", 6, "got a boolean"),
        ("once: true\ncommand: ['true']\nretry_delay: 0", "retry_delay", 6, "longer than 0"),
        ("once: true\ncommand: ['true']\nretry_delay: 0s", "retry_delay", 6, "longer than 0"),
        ("once: true\ncommand: ['true']\nmisfire_grace: 0", "misfire_grace", 6, "longer than 0"),
        ("once: true\ncommand: ['true']\nmisfire_grace: 0ms", "misfire_grace", 6, "longer than 0"),
        (
            "once: true\ncommand: ['true']\nguard: advisory\nkey_hash: md5",
            "key_hash",
            7,
            "'md5' is not one of: pgcrond, nestjs-pg-cron-lock",
        ),
        (
            "once: true\ncommand: ['true']\nguard: advisory\nlock_key: 99999999999999999999",
            "lock_key",
            7,
            "signed 64-bit",
        ),
        ("once: true\ncommand: ['true']\ncwd: ''", "cwd", 6, "must not be empty"),
        ("once: true\ncommand: ['true']\ncommand: ['false']", "command", 6, "duplicate key"),
    ],
)
def test_each_mistake_is_one_issue_naming_file_line_job_and_field(
    tmp_path: Path, body: str, field: str, line: int, message: str
) -> None:
    issue = job_issue(tmp_path, body)
    assert issue.file == str(tmp_path / "pgcrond.yaml")
    assert (issue.job, issue.field, issue.line) == ("j", field, line)
    assert message in issue.message
    assert f"pgcrond.yaml:{line}: job 'j': field '{field}'" in str(issue)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ('""', "job code must not be blank"),
        ('" "', "job code must not be blank"),
        ('" padded"', "job code must not start or end with whitespace"),
        ('"tab\\there"', "job code must not contain control characters (found U+0009)"),
        # NEL: not whitespace to str.strip's old regex, a control character to the keys.
        ('"nel\\x85job"', "job code must not contain control characters (found U+0085)"),
        # U+FEFF is trimmed by the keys' JavaScript trim: it would share the key of "bom".
        ('"bom\\ufeff"', "job code must not start or end with whitespace"),
        ('"\\u00a0nbsp"', "job code must not start or end with whitespace"),
        ("x" * 201, "job code must be at most 200 characters, got 201"),
    ],
)
def test_bad_job_codes(tmp_path: Path, code: str, message: str) -> None:
    """Codes follow the identity keys' rule: none can pass here and then fail at a tick."""
    path = write(tmp_path, EMBEDDED + f"jobs:\n  {code}:\n    once: true\n    command: ['true']\n")
    issue = only_issue(path)
    assert (issue.line, issue.field, issue.message) == (3, None, message)


def test_a_code_of_200_characters_and_non_ascii_codes_are_accepted(tmp_path: Path) -> None:
    codes = ["x" * 200, "café-nightly", "日次"]
    body = "".join(f"  {code}:\n    once: true\n    command: ['true']\n" for code in codes)
    config = load_config([write(tmp_path, EMBEDDED + "jobs:\n" + body)], environ={})
    assert list(config.jobs) == codes


def test_a_code_with_a_trailing_bom_is_refused_not_merged_with_the_plain_code(
    tmp_path: Path,
) -> None:
    """Trimmed, "bom\\ufeff" is "bom": the two would claim the same lease rows."""
    body = 'jobs:\n  bom:\n    once: true\n    command: ["true"]\n  "bom\\ufeff":\n    once: true\n'
    issue = only_issue(write(tmp_path, EMBEDDED + body + '    command: ["true"]\n'))
    assert (issue.line, issue.job) == (6, "bom\ufeff")
    assert "whitespace" in issue.message


def test_zero_retry_delay_and_misfire_grace_defaults_are_reported_once_at_the_defaults(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        EMBEDDED
        + "defaults:\n  retry_delay: 0\n  misfire_grace: 0s\n"
        + HELLO
        + "  other:\n    once: true\n    command: ['true']\n",
    )
    issues = issues_of(path)
    assert [(i.line, i.job, i.field, i.message) for i in issues] == [
        (3, None, "defaults.retry_delay", "must be longer than 0"),
        (4, None, "defaults.misfire_grace", "must be longer than 0"),
    ]


# --- history retention ---------------------------------------------------------------


def test_min_history_retention_is_the_longest_misfire_grace_plus_lease_and_at_least_an_hour(
    tmp_path: Path,
) -> None:
    assert min_history_retention({}) == timedelta(hours=1)
    path = write(
        tmp_path,
        EMBEDDED
        + HELLO  # default misfire_grace 5m + lease 1m: below the 1 hour floor
        + "  long:\n    once: true\n    command: ['true']\n    misfire_grace: 2h\n    lease: 10m\n"
        + "  short:\n    once: true\n    command: ['true']\n    misfire_grace: 3h\n",
    )
    jobs = load_config([path], environ={}).jobs
    assert min_history_retention({"hello": jobs["hello"]}) == timedelta(hours=1)
    assert min_history_retention(jobs) == timedelta(hours=3, minutes=1)


@pytest.mark.parametrize(
    ("retention", "job_lines", "message"),
    [
        (
            "30m",
            "",
            "must be at least 1h (the floor): a finished run deleted sooner can be claimed "
            "afresh by a late replica and run twice",
        ),
        (
            "2h",
            "    misfire_grace: 2h\n    lease: 10m\n",
            "must be at least 2h10m (misfire_grace + lease of job 'hello')",
        ),
    ],
)
def test_a_history_retention_below_the_minimum_is_refused(
    tmp_path: Path, retention: str, job_lines: str, message: str
) -> None:
    path = write(tmp_path, EMBEDDED + f"history_retention: {retention}\n" + HELLO + job_lines)
    issue = only_issue(path)
    assert (issue.file, issue.line, issue.job, issue.field) == (
        str(path),
        2,
        None,
        "history_retention",
    )
    assert message in issue.message


def test_a_history_retention_equal_to_the_minimum_is_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + "history_retention: 2h10m\n" + HELLO + "    misfire_grace: 2h\n    lease: 10m\n",
    )
    config = load_config([path], environ={})
    assert (
        config.history_retention
        == min_history_retention(config.jobs)
        == timedelta(hours=2, minutes=10)
    )


def test_the_default_history_retention_is_refused_when_a_job_needs_longer(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + HELLO + "    misfire_grace: 31d\n")
    issue = only_issue(path)
    assert (issue.file, issue.line, issue.field) == (str(path), None, "history_retention")
    assert "the default 30d is short; must be at least 31d1m" in issue.message


def test_a_wrong_history_retention_is_one_issue_not_also_too_short(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, EMBEDDED + "history_retention: 0\n" + HELLO))
    assert (issue.field, issue.message) == ("history_retention", "must be longer than 0")


def test_a_wrong_default_is_reported_once_at_the_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED
        + "defaults:\n  timezone: Mars/Base\n  lease: 1m\n  heartbeat: 40s\n"
        + HELLO
        + "  other:\n    once: true\n    command: ['true']\n",
    )
    issues = issues_of(path)
    assert [(i.line, i.job, i.field) for i in issues] == [
        (3, None, "defaults.timezone"),
        (5, None, "defaults.heartbeat"),
    ]


def test_a_job_lease_that_breaks_the_default_heartbeat_blames_the_default_for_that_job(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, EMBEDDED + "defaults:\n  heartbeat: 29s\n" + HELLO + "    lease: 50s\n")
    issue = only_issue(path)
    assert (issue.line, issue.job, issue.field) == (3, "hello", "defaults.heartbeat")


def test_all_issues_are_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        database: {schema: "1bad"}
        defualts: {}
        jobs:
          a:
            cron: "61 * * * *"
            command: ["true"]
          b:
            once: true
            shell: "true"
            timeout: soon
        """,
    )
    issues = issues_of(path)
    # Sorted by file and line, whatever order the checks ran in.
    assert [(i.line, i.job, i.field) for i in issues] == [
        (1, None, "database.schema"),
        (1, None, "database"),
        (2, None, "defualts"),
        (5, "a", "cron"),
        (10, "b", "timeout"),
    ]
    assert "did you mean 'defaults'?" in issues[2].message


def test_top_level_wrong_types(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + "http: {listen: nowhere}\nshutdown_grace: -1\n" + HELLO)
    issues = issues_of(path)
    assert [(i.field, i.line) for i in issues] == [("http.listen", 2), ("shutdown_grace", 3)]
    path = write(tmp_path, EMBEDDED + "jobs: [a, b]\n", "list.yaml")
    assert "must be a mapping of code: value, got a list" in only_issue(path).message


def test_a_job_may_keep_its_history_shorter_or_longer_than_the_rest(tmp_path: Path) -> None:
    # A per-second job's 30 days are 2.6 M rows: it keeps a day; the top-level
    # check leaves it out (its own misfire window is checked against its own).
    path = write(
        tmp_path,
        EMBEDDED
        + "history_retention: 2h\n"
        + HELLO
        + "    history_retention: 1d\n"
        + "  audit:\n    once: true\n    command: ['true']\n    history_retention: 400d\n"
        + "    misfire_grace: 3h\n",
    )
    config = load_config([path], environ={})
    assert timedelta(days=1) == config.jobs["hello"].history_retention
    assert [
        PruneRule(timedelta(hours=2), excluding=("audit", "hello")),
        PruneRule(timedelta(days=1), only=("hello",)),
        PruneRule(timedelta(days=400), only=("audit",)),
    ] == prune_rules(config)


def test_a_jobs_history_retention_below_its_misfire_window_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, EMBEDDED + HELLO + "    misfire_grace: 2h\n    history_retention: 90m\n")
    issue = only_issue(path)
    assert (issue.job, issue.field) == ("hello", "history_retention")
    assert "must be at least 2h1m" in issue.message
