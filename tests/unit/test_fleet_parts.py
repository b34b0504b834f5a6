"""The pure parts of the fleet: breaker changes announced and applied, the command agent's input
rules, the fleet messages' validation, and the list's `lost` on the database clock."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from sasflow.agents.command import command_input
from sasflow.agents.errors import BreakerOpenError, PermanentError
from sasflow.agents.fleet import FleetLink
from sasflow.agents.resilience import SharedBreaker
from sasflow.errors import InvalidMessageError
from sasflow.fleet_messages import AgentHeartbeat, BreakerAnnouncement
from sasflow.messages import parse
from sasflow.policy import BreakerPolicy
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names


def _every_failure(exc: BaseException) -> bool:
    return True


def _down() -> None:
    raise ConnectionError("down")


def _breaker(reset_timeout: float = 60.0) -> tuple[SharedBreaker, list[tuple[str, str, float]]]:
    told: list[tuple[str, str, float]] = []
    breaker = SharedBreaker(
        "bank",
        BreakerPolicy(fail_max=2, reset_timeout=reset_timeout),
        on_change=lambda *change: told.append(change),
    )
    return breaker, told


def test_a_breaker_that_opens_on_its_own_failures_announces_it_once() -> None:
    breaker, told = _breaker()
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(_down, _every_failure)
    with pytest.raises(BreakerOpenError):
        breaker.call(_down, _every_failure)
    assert told == [("bank", "open", 60.0)]


def test_an_announced_open_opens_a_closed_breaker_for_the_time_announced_and_is_not_echoed() -> (
    None
):
    breaker, told = _breaker()
    assert breaker.apply_remote("open", 12.0)
    open_for = breaker.open_for()
    assert open_for is not None
    assert 11.0 < open_for <= 12.0
    assert not breaker.apply_remote("open", 30.0), "an open breaker keeps its own timing"
    assert told == []


def test_an_announced_open_never_outlasts_the_breakers_own_reset_timeout() -> None:
    breaker, _ = _breaker(reset_timeout=5.0)
    breaker.apply_remote("open", 3600.0)
    open_for = breaker.open_for()
    assert open_for is not None
    assert open_for <= 5.0


def test_a_successful_trial_announces_the_close_and_an_announced_close_closes_the_peers() -> None:
    peer, peer_told = _breaker(reset_timeout=0.01)
    peer.apply_remote("open", 0.0)  # its open period is over: the next call is the trial
    assert peer.call(lambda: "fine", _every_failure) == "fine"
    assert (peer.state, peer_told) == ("closed", [("bank", "closed", 0.0)])
    opened, told = _breaker()
    opened.apply_remote("open", 60.0)
    assert opened.apply_remote("closed", 0.0)
    assert (opened.state, told) == ("closed", [])
    assert opened.call(lambda: "again", _every_failure) == "again"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("echo hi", "object with 'argv'"),
        ({"argv": "echo hi"}, "list of strings"),
        ({"argv": []}, "list of strings"),
        ({"argv": ["echo", 1]}, "list of strings"),
        ({"argv": ["echo"], "env": {"A": 1}}, "'env' must be an object of strings"),
        ({"argv": ["echo"], "cwd": 3}, "'cwd' must be a string"),
        ({"argv": ["echo"], "shell": True}, "unknown field(s) ['shell']"),
        ({"argv": ["echo", "a\x00b"]}, "NUL"),
    ],
)
def test_command_input_is_refused_with_the_reason(value: Any, problem: str) -> None:
    with pytest.raises(PermanentError) as raised:
        command_input(value)
    assert problem in str(raised.value)


def test_command_input_accepts_argv_env_and_cwd() -> None:
    assert command_input({"argv": ["ls", "-l"], "env": {"A": "1"}, "cwd": "/srv"}) == (
        ["ls", "-l"],
        {"A": "1"},
        "/srv",
    )


def test_fleet_messages_round_trip_and_refuse_what_they_cannot_be() -> None:
    heartbeat = AgentHeartbeat(
        agent="payments",
        instance_id="agent-payments:h:1:abc",
        hostname="h",
        pid=1,
        version="1",
        concurrency=4,
        in_flight=1,
        breakers={"bank": "half-open"},
        interval_s=5,
    )
    assert parse(AgentHeartbeat, heartbeat.encode()) == heartbeat
    with pytest.raises(InvalidMessageError, match="interval_s"):
        parse(AgentHeartbeat, heartbeat.encode().replace(b'"interval_s":5.0', b'"interval_s":0'))
    with pytest.raises(InvalidMessageError, match="breakers"):
        parse(AgentHeartbeat, heartbeat.encode().replace(b"half-open", b"ajar"))
    with pytest.raises(InvalidMessageError, match="state"):
        parse(
            BreakerAnnouncement,
            b'{"agent":"a","instance_id":"i","dependency":"d","state":"half-open"}',
        )


class _Published:
    """A transport that keeps what is published (FleetLink's only use of it here)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def publish(self, message: Any) -> None:
        self.sent.append(message)

    def call_threadsafe(self, callback: Any) -> None:
        callback()


def test_heartbeats_say_what_uses_each_dependency_and_how_long_open_breakers_stay_open() -> None:
    """Flow control reads them: a dependency's actions, and an open breaker's time to its
    trial; a breaker change makes the next heartbeat due at once. An old agent's heartbeat
    (no `actions`) still parses."""
    transport = _Published()
    link = FleetLink(
        "agent-pay:h:1:abc",
        "pay",
        cast(Transport, transport),
        Names("ns"),
        concurrency=4,
        interval=5,
        actions={"charge": "bank", "refund": None},
    )
    breaker, _ = _breaker(reset_timeout=60)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(_down, _every_failure)
    link.heartbeat({"bank": breaker}, in_flight=0)
    beat = parse(AgentHeartbeat, transport.sent[-1].body)
    assert beat.actions == {"charge": "bank", "refund": None}
    assert beat.breakers == {"bank": "open"}
    assert 59 < beat.breakers_open_for_s["bank"] <= 60
    assert link.next_heartbeat > 0
    link.breaker_changed("bank", "open", 60.0)
    link.tick({"bank": breaker}, in_flight=0)
    assert [parse(AgentHeartbeat, m.body).seq for m in transport.sent[-1:]] == [2]
    old = beat.model_dump(exclude={"actions", "breakers_open_for_s"})
    assert parse(AgentHeartbeat, json.dumps(old).encode()).actions is None
    with pytest.raises(InvalidMessageError, match="actions"):
        parse(AgentHeartbeat, json.dumps({**old, "actions": {"no spaces": None}}).encode())
