"""The container image, built from the Dockerfile and run: three replicas in podman.

There is no registry and no Docker daemon here, so the image is built with
Debian's podman on a Debian base made by debootstrap (cached between runs on
one machine, rebuilt when missing) and passed through the Dockerfile's
PYTHON_IMAGE build argument, the same way as on the official base. The build's
pip reaches the index the way this machine's pip does: its settings and
certificate are handed to the build as secrets, mounted for one step only. The
containers use the host network to reach the suite's PostgreSQL on 127.0.0.1.

Skips, saying why, where podman cannot run (not root, tools not installed);
.ci/run installs podman, runc and debootstrap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgcrond.storage.embedded import free_port
from tests.helpers import deploy_contract as contract
from tests.helpers.daemon_harness import wait_until
from tests.helpers.http import status_of

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("PGCROND_TEST_CACHE", "/var/cache/pgcrond-test"))
BASE_TARBALL = CACHE / "debian-bookworm-python3.tar"
BASE = "localhost/pgcrond-test-base:bookworm"
IMAGE = "localhost/pgcrond:test"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates"
# The base's own CA bundle: the build's certificate must not end up over it.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Podman's defaults that this machine refuses: crun on hybrid cgroups, and
# rlimits above the host's. No systemd here: cgroupfs, a file event log and
# logs kept by podman itself.
CONTAINERS_CONF = """\
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# pip settings that reach an index from inside the build; local paths
# (find-links, constraints, file:// indexes) do not exist there.
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout")
PIP_CERT_KEYS = ("cert",)
SECRET_CERT = "/run/secrets/pip-cert"


@dataclass(frozen=True)
class Image:
    tag: str
    podman: Podman
    build_seconds: float
    inspect: dict[str, Any]
    labels: dict[str, str]


class Podman:
    """podman with this suite's containers.conf, never /etc's."""

    def __init__(self, conf: Path) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args],
            input=None if stdin is None else stdin.decode(),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
        return result


def podman_or_skip(conf_dir: Path) -> Podman:
    if os.geteuid() != 0:
        pytest.skip("the image test runs podman as root (rootless needs subuid ranges here)")
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed "
            "(apt-get install podman runc debootstrap; .ci/run does)"
        )
    conf = conf_dir / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    podman = Podman(conf)
    if (info := podman("info", check=False)).returncode != 0:
        pytest.skip(f"podman cannot run here: {info.stderr.strip()[-500:]}")
    return podman


def ensure_base(podman: Podman) -> None:
    """The debootstrap'd base in podman's store, from the cached tarball, made when missing."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    if not BASE_TARBALL.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            root = Path(work) / "rootfs"
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={DEBOOTSTRAP_PACKAGES}",
                    "bookworm",
                    str(root),
                ],
                capture_output=True,
                check=True,
                timeout=900,
            )
            partial = Path(work) / "base.tar"
            subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
            # Renamed into place only when whole: an interrupted run leaves no half base.
            partial.rename(BASE_TARBALL)
    # A tarball carries no image config: give it the PATH an official base has.
    podman("import", "--change", f"ENV PATH={BASE_PATH}", str(BASE_TARBALL), BASE, timeout=300)


def pip_settings() -> dict[str, str]:
    """This machine's effective pip settings (files and PIP_* variables), last one wins."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    return settings


def build_secrets(work: Path) -> list[str]:
    """``--secret`` arguments: a pip.conf for inside the build, and its certificate."""
    settings = pip_settings()
    lines = ["[global]"]
    secrets: list[str] = []
    for key in PIP_KEYS:
        value = settings.get(key)
        if key.endswith("index-url") and value:
            value = " ".join(url for url in value.split() if not url.startswith("file:"))
        if value:
            lines.append(f"{key} = {value}")
    cert = next((settings[k] for k in PIP_CERT_KEYS if settings.get(k)), None)
    if cert is not None and Path(cert).is_file():
        lines.append(f"cert = {SECRET_CERT}")
        secrets += ["--secret", f"id=pip-cert,src={cert}"]
    conf = work / "pip.conf"
    conf.write_text("\n".join(lines) + "\n")
    return ["--secret", f"id=pip.conf,src={conf}", *secrets]


def git_revision() -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else "unknown"


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory, system_processes: None) -> Iterator[Image]:
    """The Dockerfile built with podman on the debootstrap'd base; removed at the end.

    Every test that uses it is in the system tier (``system_processes``): it
    builds an image and starts containers.
    """
    work = tmp_path_factory.mktemp("image")
    podman = podman_or_skip(work)
    ensure_base(podman)
    labels = {
        "VERSION": "0.0.0-test",
        "REVISION": git_revision(),
        "CREATED": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    started = time.monotonic()
    podman(
        "build",
        "--isolation",
        "chroot",
        "--network",
        "host",
        # The docker format keeps HEALTHCHECK, which the OCI format drops.
        "--format",
        "docker",
        "--build-arg",
        f"PYTHON_IMAGE={BASE}",
        *(arg for name, value in labels.items() for arg in ("--build-arg", f"{name}={value}")),
        *build_secrets(work),
        "--tag",
        IMAGE,
        "--file",
        str(REPO / "Dockerfile"),
        str(REPO),
        timeout=600,
    )
    build_seconds = time.monotonic() - started
    inspect = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    yield Image(IMAGE, podman, build_seconds, inspect, labels)
    podman("rmi", "--force", IMAGE, check=False)


def test_the_image_holds_no_compiler_no_pip_and_nothing_of_the_build_s_secrets(
    image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    size_mb = image.inspect["Size"] / 1e6
    with capsys.disabled():
        print(f"\nimage {image.tag}: {size_mb:.0f} MB, built in {image.build_seconds:.0f} s")
    probe = (
        "import importlib.util, json, os, shutil, subprocess, sys\n"
        "system_python = os.path.join(sys.base_prefix, 'bin', 'python3')\n"
        "print(json.dumps({\n"
        "  'tools': [t for t in ('cc', 'gcc', 'c++', 'pip', 'pip3') if shutil.which(t)],\n"
        "  'venv_pip': importlib.util.find_spec('pip') is not None,\n"
        "  'system_pip': subprocess.run([system_python, '-c', 'import pip'],\n"
        "                               capture_output=True).returncode == 0,\n"
        "  'pip_conf': [os.path.join(d, f) for base in ('/etc', '/root', '/opt', '/run')\n"
        "               for d, _, fs in os.walk(base) for f in fs if f == 'pip.conf'],\n"
        "  'secrets': os.listdir('/run/secrets') if os.path.isdir('/run/secrets') else [],\n"
        f"  'ca_bundle': open({CA_BUNDLE!r}, 'rb').read().hex(),\n"
        "}))\n"
    )
    found = json.loads(
        image.podman(
            "run", "--rm", "--network", "none", "--entrypoint", "python", image.tag, "-c", probe
        ).stdout
    )
    base_bundle = image.podman(
        "run", "--rm", "--network", "none", BASE, "sha256sum", CA_BUNDLE
    ).stdout.split()[0]
    assert {
        "tools": [],
        "venv_pip": False,
        "system_pip": False,
        "pip_conf": [],
        "secrets": [],
        "ca_bundle": base_bundle,
    } == {**found, "ca_bundle": hashlib.sha256(bytes.fromhex(found["ca_bundle"])).hexdigest()}
    config = image.inspect["Config"]
    assert f"{contract.CONTAINER_UID}:{contract.CONTAINER_UID}" == config["User"]
    assert {
        f"org.opencontainers.image.{key.lower()}": value for key, value in image.labels.items()
    }.items() <= config["Labels"].items()


# --- three replicas in containers ---------------------------------------------

TICK_EVERY_S = 2
# Each look at a container's log runs `podman logs` (a Go binary, tens of ms of
# CPU): at the harness's 50 ms, three containers' polls took a core from them.
PODMAN_POLL_S = 0.5
DRAIN_SLEEP_S = 4
SHUTDOWN_GRACE_S = 20


def replica_config(schema: str, drain_at: dt.datetime) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        f"shutdown_grace: {SHUTDOWN_GRACE_S}s\n"
        "jobs:\n"
        "  tick:\n"
        f'    cron: "*/{TICK_EVERY_S} * * * * *"\n'
        '    command: ["echo", "tick"]\n'
        "  drain:\n"
        f'    at: "{drain_at.strftime("%Y-%m-%dT%H:%M:%SZ")}"\n'
        f'    command: ["sh", "-c", "sleep {DRAIN_SLEEP_S}; echo drained"]\n'
    )


@dataclass
class Container:
    name: str
    podman: Podman

    def logs(self) -> list[str]:
        result = self.podman("logs", self.name, check=False)
        return result.stdout.splitlines() + result.stderr.splitlines()

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.logs():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == name:
                    found.append(event)
        return found

    def wait_event(self, name: str, timeout: float = 60) -> dict[str, Any]:
        try:
            found: list[dict[str, Any]] = wait_until(
                lambda: self.events(name), timeout, f"{self.name}: {name}", every=PODMAN_POLL_S
            )
        except AssertionError as missed:
            # The container's own last words say why, where a timeout cannot.
            raise AssertionError("\n".join([str(missed), *self.logs()[-20:]])) from None
        return found[0]

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.podman("inspect", self.name).stdout)[0]["State"]
        return state


@contextlib.contextmanager
def replicas(
    image: Image, dsn: str, config_dir: Path, ports: list[int]
) -> Iterator[list[Container]]:
    started: list[Container] = []
    try:
        for n, port in enumerate(ports):
            name = f"pgcrond-test-{os.getpid()}-{n}"
            image.podman(
                "run",
                "--detach",
                "--name",
                name,
                "--network",
                "host",
                "--read-only",
                "--tmpfs",
                "/tmp",
                "--volume",
                f"{config_dir}:{contract.CONTAINER_CONFIG_DIR}:ro",
                "--env",
                f"{contract.DATABASE_URL_ENV}={dsn}",
                image.tag,
                "run",
                "-c",
                contract.CONTAINER_CONFIG_DIR,
                "--http",
                f"127.0.0.1:{port}",
            )
            started.append(Container(name, image.podman))
        yield started
    finally:
        for container in started:
            image.podman("rm", "--force", "--time", "0", container.name, check=False)


def lease_rows(dsn: str, schema: str, job: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            f'SELECT run_key, status, attempt, owner FROM "{schema}".leases WHERE code = %s',
            (job,),
        ).fetchall()


def test_three_replicas_in_containers_run_every_tick_once_and_drain_when_stopped(
    image: Image, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    config_dir = tmp_path / "etc-pgcrond"
    config_dir.mkdir()
    drain_at = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=20)
    (config_dir / "pgcrond.yaml").write_text(replica_config(schema, drain_at))
    # The first keeps the image's own port, where its HEALTHCHECK probes.
    ports = [contract.HTTP_PORT, free_port(), free_port()]
    with replicas(image, pg_dsn, config_dir, ports) as containers:
        ready = [c.wait_event("daemon_ready") for c in containers]
        # PID namespaces and one host name: the suffix keeps the names apart.
        names = [event["replica"] for event in ready]
        assert len(set(names)) == 3, names
        assert image.podman("healthcheck", "run", containers[0].name).returncode == 0

        processes_probe = (
            "import json, os\n"
            "procs = {}\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    with open(f'/proc/{pid}/cmdline', 'rb') as f: cmd = f.read().split(b'\\0')\n"
            "    procs[pid] = [c.decode() for c in cmd if c], os.stat(f'/proc/{pid}').st_uid\n"
            "print(json.dumps(procs))\n"
        )
        for container in containers:
            procs = json.loads(
                image.podman("exec", container.name, "python", "-c", processes_probe).stdout
            )
            assert "/usr/bin/tini" == procs["1"][0][0]
            daemon = [
                uid
                for cmd, uid in procs.values()
                if cmd[1:3] == ["/opt/pgcrond/bin/pgcrond", "run"]
            ]
            assert [contract.CONTAINER_UID] == daemon, procs
            assert {contract.CONTAINER_UID} == {uid for _, uid in procs.values()}, procs
        # The root filesystem is read-only; /tmp is the jobs' scratch.
        write = image.podman(
            "exec", containers[1].name, "sh", "-c", "touch /opt/x; touch /tmp/x", check=False
        )
        assert "Read-only file system" in write.stderr
        tmp = image.podman("exec", containers[1].name, "test", "-f", "/tmp/x", check=False)
        assert 0 == tmp.returncode

        # Stop whichever replica runs the drain job while it runs.
        runner = wait_until(
            lambda: next((c for c in containers if "drained" not in str(c.logs())
                          and any(e.get("job") == "drain" for e in c.events("run_started"))),
                         None),
            60,
            "the drain job to start",
            every=PODMAN_POLL_S,
        )  # fmt: skip
        stop_started = time.monotonic()
        image.podman("stop", "--time", str(contract.SUPERVISOR_STOP_TIMEOUT_S), runner.name)
        stop_seconds = time.monotonic() - stop_started
        others = [c for c in containers if c is not runner]
        for container in others:
            image.podman("stop", "--time", str(contract.SUPERVISOR_STOP_TIMEOUT_S), container.name)
        states = [c.state() for c in containers]
        logs = {c.name: c.logs() for c in containers}

    assert [0, 0, 0] == [s["ExitCode"] for s in states]
    assert stop_seconds < SHUTDOWN_GRACE_S, stop_seconds
    drained = lease_rows(pg_dsn, schema, "drain")
    assert [("SUCCESS", 1)] == [(r["status"], r["attempt"]) for r in drained]

    not_json = [(n, line) for n, lines in logs.items() for line in lines if not is_json(line)]
    assert [] == not_json
    ticks = lease_rows(pg_dsn, schema, "tick")
    assert ticks, "no tick ran"
    assert {("SUCCESS", 1)} == {(r["status"], r["attempt"]) for r in ticks}
    # Every tick of the run ran once: one run per run key in the logs, none missing.
    outputs = Counter(
        event["run_key"]
        for lines in logs.values()
        for event in map(json.loads, lines)
        if event.get("event") == "job_output" and event.get("line", "").strip() == "tick"
    )
    assert {1} == set(outputs.values())
    assert {r["run_key"] for r in ticks} == set(outputs)
    keys = sorted(dt.datetime.fromisoformat(k) for k in outputs)
    gaps = {b - a for a, b in itertools.pairwise(keys)}
    assert {dt.timedelta(seconds=TICK_EVERY_S)} == gaps
    assert len({r["owner"] for r in ticks}) > 1


def is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def test_an_image_from_pgcrond_with_jobs_of_its_own_runs_them_in_a_replica(
    image: Image, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """deploy/jobs-image: Debian programs and a Python package added FROM the image; a
    replica container runs the job that uses them, as the daemon's uid."""
    jobs = dataclasses.replace(image, tag="localhost/pgcrond-jobs:test")
    image.podman(
        "build", "--isolation", "chroot", "--network", "host", "--format", "docker",
        "--build-arg", f"PGCROND_IMAGE={image.tag}", *build_secrets(tmp_path),
        "--tag", jobs.tag, str(REPO / "deploy" / "jobs-image"),
        timeout=600,
    )  # fmt: skip
    config_dir = tmp_path / "etc-pgcrond"
    config_dir.mkdir()
    (config_dir / "pgcrond.yaml").write_text(
        f"database: {{url: '${{PGCROND_DATABASE_URL}}', schema: {schema}}}\n"
        "jobs:\n  report: {once: true, command: [/opt/jobs/bin/report]}\n"
    )
    try:
        with replicas(jobs, pg_dsn, config_dir, [free_port()]) as [container]:
            container.wait_event("daemon_ready")
            [finished] = wait_until(
                lambda: [e for e in container.events("run_finished") if e["job"] == "report"],
                60,
                "the report's run",
                every=PODMAN_POLL_S,
            )
            printed = [e["line"] for e in container.events("job_output") if e["job"] == "report"]
    finally:
        image.podman("rmi", "--force", jobs.tag, check=False)
    assert "success" == finished["outcome"], printed
    header, _, row = printed
    assert ["job", "run", "key", "curl", "uid"] == header.split()
    assert ["report", "(once)", str(contract.CONTAINER_UID)] == [
        row.split()[0], row.split()[1], row.split()[3]
    ]  # fmt: skip
    assert row.split()[2][0].isdigit()  # curl's version, from the Debian package


def test_the_default_command_on_every_interface_serves_metrics_but_not_the_page(
    image: Image, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The image's own CMD (``--http 0.0.0.0:9464``), no users: job output stays in."""
    config_dir = tmp_path / "etc-pgcrond"
    config_dir.mkdir()
    (config_dir / "pgcrond.yaml").write_text(
        f"database:\n  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\n"
        "jobs:\n  quiet:\n    cron: '0 3 * * *'\n    command: ['true']\n"
    )
    name = f"pgcrond-default-{os.getpid()}"
    image.podman(
        "run", "--detach", "--name", name, "--network", "host", "--read-only",
        "--tmpfs", "/tmp", "--volume", f"{config_dir}:{contract.CONTAINER_CONFIG_DIR}:ro",
        "--env", f"{contract.DATABASE_URL_ENV}={pg_dsn}", image.tag,
    )  # fmt: skip
    try:
        container = Container(name, image.podman)
        container.wait_event("daemon_ready")
        base = f"http://127.0.0.1:{contract.HTTP_PORT}"
        assert 404 == status_of(base + "/status")
        assert 200 == status_of(base + "/metrics")
        assert container.events("status_page_withheld")
    finally:
        image.podman("rm", "--force", "--time", "0", name, check=False)
