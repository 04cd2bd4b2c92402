"""A serving engine's HTTP server as a test fixture: start it on a free port, wait until healthy, talk JSON
and server-sent events to it, and always kill its whole process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

REQUEST_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(log_path, lines: int = 60) -> str:
    with open(log_path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False when no process is left in it (signal 0 only asks)."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the server's whole group (front end and engine processes), then SIGKILL whatever outlives the grace."""
    pgid = proc.pid  # start_new_session made the server the leader of its own group
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader: as a zombie it would keep the group "alive"
        if not signal_group(pgid, 0):
            break
        time.sleep(0.2)
    signal_group(pgid, signal.SIGKILL)
    proc.wait(timeout=10)


def wait_until_healthy(proc: subprocess.Popen, base_url: str, log_path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode} before it was ready:\n{log_tail(log_path)}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet: the engine is still starting
        time.sleep(1)
    pytest.fail(f"the server was not healthy after {deadline_s} s:\n{log_tail(log_path)}")


@contextlib.contextmanager
def running_server(command: list[str], port: int, log_path, deadline_s: float, env: dict | None = None):
    """Run ``command`` (a server listening on ``port``) in its own process group; yield its base URL."""
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the server
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, **(env or {})), start_new_session=True)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_until_healthy(proc, base_url, log_path, deadline_s)
        yield base_url
    finally:
        stop_process_group(proc)


def post(base_url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:  # 4xx/5xx still carry the server's JSON body
        return e.code, json.load(e)


def post_stream(base_url: str, path: str, body: dict) -> list[dict]:
    """The JSON events of a server-sent-events answer, up to ``data: [DONE]``."""
    request = urllib.request.Request(base_url + path, data=json.dumps(dict(body, stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status == 200
        assert r.headers.get_content_type() == "text/event-stream"
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue  # blank separators between events
            data = line[len("data: "):]
            if data == "[DONE]":
                return events
            events.append(json.loads(data))
    pytest.fail(f"stream ended without data: [DONE] after {len(events)} events")
