"""The tests' HTTP client: httpx, against a server on this machine."""

from __future__ import annotations

from collections.abc import Mapping

import httpx


async def fetch(
    port: int,
    path: str,
    *,
    method: str = "GET",
    accept: str = "*/*",
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, httpx.Headers, bytes]:
    """One request to ``127.0.0.1:port``: the status, the headers and the body as sent."""
    # trust_env=False: a proxy set in the environment must not stand between
    # the test and the server it started.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
        # Only what the test asks for: no Accept-Encoding unless it sends one.
        del client.headers["Accept-Encoding"]
        sent = {"Accept": accept, **(headers or {})}
        async with client.stream(method, path, headers=sent, content=body) as response:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
    return response.status_code, response.headers, raw


def answer(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    method: str = "GET",
    form: Mapping[str, str] | None = None,
    timeout: float = 10,
) -> httpx.Response:
    """One request, redirects not followed.

    Any certificate is good: the tests' own are self-signed.
    """
    return httpx.request(
        method, url, headers=headers, data=form, timeout=timeout, verify=False, trust_env=False
    )


def status_of(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    method: str = "GET",
    form: Mapping[str, str] | None = None,
    timeout: float = 10,
) -> int:
    """The status :func:`answer` gets, or 0 while nothing answers."""
    try:
        return answer(url, headers, method=method, form=form, timeout=timeout).status_code
    except httpx.TransportError:
        return 0
