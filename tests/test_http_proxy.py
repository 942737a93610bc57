"""The trusted-proxy sign-in through a real nginx in front of a real replica.

nginx signs people in (HTTP Basic against its own file) and names the user in
``X-Forwarded-User``, replacing whatever a client sent under that name; the
replica lists nginx's address in ``http.trusted_proxies`` and gives the users
it names their roles. Skipped only when nginx is not installed (CI's
``.ci/run`` installs Debian's ``nginx-light``).
"""

from __future__ import annotations

import base64
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgcrond.daemon.page.routes import job_path
from tests.helpers.daemon_harness import cluster, config, wait_until
from tests.helpers.http import answer, status_of

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: nginx-light)"),
    pytest.mark.usefixtures("system_processes"),
]
PASSWORDS = {"olga": "olga-pw", "vera": "vera-pw"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def nginx_in_front(workdir: Path, upstream: str) -> Iterator[str]:
    """nginx on a free loopback port, signing in and proxying to ``upstream``; its base URL."""
    assert NGINX is not None
    port = free_port()
    workdir.mkdir()
    # nginx's own {PLAIN} scheme: a test file, never a real one.
    (workdir / "htpasswd").write_text(
        "".join(f"{user}:{{PLAIN}}{password}\n" for user, password in PASSWORDS.items())
    )
    (workdir / "nginx.conf").write_text(
        f"""\
daemon off;
master_process off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi;
  uwsgi_temp_path {workdir}/uwsgi;
  scgi_temp_path {workdir}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      auth_basic "pgcrond";
      auth_basic_user_file {workdir}/htpasswd;
      proxy_pass http://{upstream};
      proxy_set_header Host $http_host;
      # Replaces a client's own header of that name: only nginx names the user.
      proxy_set_header X-Forwarded-User $remote_user;
      proxy_set_header Authorization "";
    }}
  }}
}}
"""
    )
    process = subprocess.Popen(
        [NGINX, "-p", str(workdir), "-c", str(workdir / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: status_of(base + "/healthz", {}) == 401, 15, "nginx to listen")
        yield base
    finally:
        process.terminate()
        process.wait(10)


def signed(user: str) -> dict[str, str]:
    credential = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return {"Authorization": f"Basic {credential}"}


def test_nginx_names_the_user_and_the_replica_gives_them_their_role(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = "  nightly:\n    cron: '0 3 * * *'\n    command: ['/bin/true']\n"
    http = (
        "http:\n"
        "  trusted_proxies: [127.0.0.1]\n"
        "  users:\n"
        "    olga: {role: operator}\n"  # no password: signs in through the proxy only
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs, extra=http)), 1)
        with nginx_in_front(tmp_path / "nginx", replica.http_address()) as base:
            page = base + job_path("nightly")
            # nginx asks first; the replica never sees a stranger.
            assert 401 == status_of(page, {})
            html = answer(page, signed("olga")).raise_for_status().text
            assert "Signed in as <b>olga</b> (operator)" in html
            assert 'class="act pause"' in html
            # A viewer (proxy_role) who sends the header naming the operator is still
            # a viewer: nginx replaced it.
            html = (
                answer(page, {**signed("vera"), "X-Forwarded-User": "olga"}).raise_for_status().text
            )
            assert "Signed in as <b>vera</b> (viewer)" in html
            assert 'method="post"' not in html
            token = re.search(
                r'name="csrf" value="([^"]+)"', answer(page, signed("olga")).raise_for_status().text
            )
            assert token is not None
            origin = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
            fields = {"csrf": token.group(1), "reason": "through nginx"}
            assert 403 == status_of(
                page + "/pause", {**signed("vera"), **origin}, method="POST", form=fields
            )
            assert 303 == status_of(
                page + "/pause", {**signed("olga"), **origin}, method="POST", form=fields
            )
        [action] = replica.events("status_page_action")
        assert ("olga", "pause", "127.0.0.1") == (action["by"], action["action"], action["peer"])
        [paused] = running.rows(f'SELECT paused_by, reason FROM "{schema}".leases_job_state')
        assert ("olga", "through nginx") == (paused["paused_by"], paused["reason"])
