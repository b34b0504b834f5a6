"""`sasflow api` processes for tests: started on a free port, ready when /healthz answers."""

from __future__ import annotations

import socket
import time

import httpx

from sasflow.ops import tokens
from sasflow.store.db import Engine, transaction
from tests.acceptance.processes import Processes

FAST_STREAM = {"SASFLOW_API_STREAM_HEARTBEAT_S": "0.5", "SASFLOW_API_STREAM_RESEND_S": "30"}
"""Heartbeats every 0.5 s: a test sees a dead stream, and a stopped client, within seconds."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_api(procs: Processes, name: str, *, timeout: float = 30) -> int:
    """Start `sasflow api` as process `name`; returns its port once it answers /healthz."""
    port = launch_api(procs, name)
    wait_ready(procs, name, port, timeout=timeout)
    return port


def launch_api(procs: Processes, name: str) -> int:
    """Start `sasflow api` as process `name` without waiting; returns its port."""
    port = free_port()
    procs.env.update(FAST_STREAM)
    procs.start(name, "api", "--port", str(port), "--no-callbacks")
    return port


def wait_ready(procs: Processes, name: str, port: int, *, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.started[name].poll() is not None:
            raise AssertionError(f"{name} exited: {procs.log(name)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{name} not ready after {timeout}s: {procs.log(name)}")


def token(engine: Engine, name: str, *scopes: str) -> str:
    """A new token's secret."""
    with transaction(engine) as conn:
        return tokens.create(conn, name=name, scopes=scopes, actor="test").secret
