"""Agent definitions: handler registration, dependencies on breakers, the Call object."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sasflow.agents import Agent, Call
from sasflow.agents.jobs import retry_budget
from sasflow.errors import DefinitionError
from sasflow.policy import BreakerPolicy, RetryPolicy


def _call(deadline: float) -> Call:
    return Call(
        input={"x": 1},
        idempotency_key="k",
        attempt=1,
        deadline=deadline,
        step_id=1,
        run_id=1,
        workflow="wf",
        step="s",
        action="a",
        kind="forward",
    )


def _handler(call: Call) -> Any:
    return call.input


def test_decorator_registers_the_handler_and_returns_the_function() -> None:
    """@agent.handler(action) registers the function under that action, unchanged."""
    agent = Agent("svc")

    @agent.handler("fetch")
    def fetch(call: Call) -> Any:
        return call.input

    spec = agent.spec("fetch")
    assert spec is not None
    assert (fetch, "fetch", None) == (spec.function, spec.action, spec.dependency)
    assert fetch(_call(time.monotonic() + 1)) == {"x": 1}


def test_actions_lists_the_registered_handlers() -> None:
    """actions is the set of actions with a handler."""
    agent = Agent("svc")
    agent.add_handler("a", _handler)
    agent.handler("b")(_handler)

    assert frozenset({"a", "b"}) == agent.actions
    assert repr(agent) == "Agent('svc', actions=['a', 'b'])"


def test_unknown_action_has_no_spec() -> None:
    """spec() of an action without a handler is None."""
    assert Agent("svc").spec("missing") is None


def test_duplicate_handler_is_rejected() -> None:
    """Registering an action twice is a DefinitionError naming agent and action."""
    agent = Agent("svc")
    agent.add_handler("fetch", _handler)

    with pytest.raises(DefinitionError, match=r"agent 'svc': duplicate handler for 'fetch'"):
        agent.handler("fetch")(_handler)


def test_dependency_without_breaker_is_rejected() -> None:
    """A handler naming a dependency with no declared breaker is a DefinitionError."""
    agent = Agent("svc", breakers={"db": BreakerPolicy()})

    with pytest.raises(DefinitionError) as info:
        agent.add_handler("fetch", _handler, dependency="api")

    assert str(info.value) == (
        "agent 'svc': action 'fetch' names dependency 'api', which has no breaker (declared: db)"
    )
    assert frozenset() == agent.actions


def test_dependency_without_any_breaker_says_none_declared() -> None:
    """With no breakers at all the message says none are declared."""
    with pytest.raises(DefinitionError, match=r"\(declared: none\)"):
        Agent("svc").add_handler("fetch", _handler, dependency="api")


def test_dependency_with_declared_breaker_is_accepted() -> None:
    """A handler may name a dependency that has a breaker."""
    agent = Agent("svc", breakers={"api": BreakerPolicy(fail_max=2)})
    agent.add_handler("fetch", _handler, dependency="api")

    spec = agent.spec("fetch")
    assert spec is not None
    assert spec.dependency == "api"


def test_handler_retry_defaults_to_the_agent_retry_policy() -> None:
    """A handler without its own retry policy uses the agent's; its own one wins."""
    agent_retry, own_retry = RetryPolicy(initial=0.5), RetryPolicy(max_attempts=2)
    agent = Agent("svc", retry=agent_retry)
    agent.add_handler("a", _handler)
    agent.add_handler("b", _handler, retry=own_retry)

    specs = (agent.spec("a"), agent.spec("b"))
    assert (agent_retry, own_retry) == tuple(s.retry if s else None for s in specs)


def test_default_retry_policy_and_transient_errors() -> None:
    """An agent retries ConnectionError and TimeoutError with the default policy by default."""
    agent = Agent("svc")

    assert (RetryPolicy(), (ConnectionError, TimeoutError)) == (agent.retry, agent.transient)


@pytest.mark.parametrize("name", ["", "bad name", "x" * 101])
def test_bad_agent_name_is_rejected(name: str) -> None:
    """The agent name must be usable in a queue name."""
    with pytest.raises(DefinitionError, match="agent name"):
        Agent(name)


def test_bad_action_name_is_rejected() -> None:
    """The action name must match the name pattern."""
    with pytest.raises(DefinitionError, match=r"agent 'svc': action name 'bad action'"):
        Agent("svc").add_handler("bad action", _handler)


def test_bad_dependency_name_is_rejected() -> None:
    """Breaker dependency names must match the name pattern."""
    with pytest.raises(DefinitionError, match=r"agent 'svc': dependency name 'bad dep'"):
        Agent("svc", breakers={"bad dep": BreakerPolicy()})


def test_agent_name_is_read_only() -> None:
    """The name is a read-only property."""
    agent = Agent("svc")

    with pytest.raises(AttributeError):
        agent.name = "other"  # type: ignore[misc]
    assert agent.name == "svc"


def test_call_remaining_counts_down_to_the_deadline() -> None:
    """remaining() is the time left before the deadline."""
    remaining = _call(time.monotonic() + 10).remaining()

    assert 9.0 < remaining <= 10.0


def test_call_remaining_is_never_negative() -> None:
    """After the deadline remaining() is 0, not negative."""
    assert _call(time.monotonic() - 5).remaining() == 0.0


def test_calls_compare_without_their_cancel_event() -> None:
    """Two calls with the same fields are equal even though each has its own event."""
    deadline = time.monotonic()
    first, second = _call(deadline), _call(deadline)
    first.cancelled.set()

    assert first == second
    assert not second.cancelled.is_set()


def test_retries_leave_a_tenth_of_the_budget_at_most_one_second_for_the_reply() -> None:
    assert retry_budget(3.0) == pytest.approx(2.7)
    assert retry_budget(30.0) == pytest.approx(29.0)
    assert retry_budget(0.0) == 0.0
