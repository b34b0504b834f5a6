"""The hook seam: a chain fans events out, merges headers, and never lets a hook raise."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sasflow.hooks import NO_HOOKS, HookChain, Hooks, guarded


class Recording(Hooks):
    def __init__(self, header: str) -> None:
        self.header = header
        self.events: list[tuple[str, ...]] = []
        self.closed = 0

    def dead_lettered(self, queue: str, reason: str) -> None:
        self.events.append(("dead_lettered", queue, reason))

    def request_headers(self, step: Any) -> dict[str, str]:
        return {self.header: str(step)}

    def close(self) -> None:
        self.closed += 1


class Broken(Hooks):
    def dead_lettered(self, queue: str, reason: str) -> None:  # noqa: ARG002
        raise RuntimeError("observer bug")


def test_a_chain_fans_out_in_order_and_merges_headers() -> None:
    first, second = Recording("a"), Recording("b")
    chain = HookChain([first, second])
    chain.dead_lettered("ns.replies", "bad json")
    assert first.events == second.events == [("dead_lettered", "ns.replies", "bad json")]
    assert chain.request_headers(7) == {"a": "7", "b": "7"}  # type: ignore[arg-type]


def test_a_hook_that_raises_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    after = Recording("a")
    with caplog.at_level(logging.ERROR, logger="sasflow.hooks"):
        HookChain([Broken(), after]).dead_lettered("q", "r")
    assert after.events == [("dead_lettered", "q", "r")]
    assert "hook Broken failed on dead_lettered" in caplog.text


def test_closing_a_chain_twice_closes_each_hook_once() -> None:
    hook = Recording("a")
    chain = HookChain([hook])
    chain.close()
    chain.close()
    assert hook.closed == 1


def test_roles_guard_what_they_are_given() -> None:
    assert guarded(None) is NO_HOOKS
    chain = HookChain([])
    assert guarded(chain) is chain
    wrapped = guarded(Broken())
    assert isinstance(wrapped, HookChain)
    wrapped.dead_lettered("q", "r")  # does not raise
    assert NO_HOOKS.request_headers(object()) is None  # type: ignore[arg-type]
