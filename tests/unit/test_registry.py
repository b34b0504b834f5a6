"""The registry of workflows and agents, and loading it from `--app MODULE[:ATTRIBUTE]`."""

from __future__ import annotations

import pytest

from sasflow.agents import Agent, Call
from sasflow.appload import load_object, load_registry
from sasflow.errors import AppLoadError, DefinitionError, SasflowError, UnknownWorkflowError
from sasflow.registry import LISTED_NAMES, ExternalAgent, Registry, names_list
from sasflow.workflow import Step, Workflow


def _noop(call: Call) -> None:
    del call


def _python_agent() -> Agent:
    agent = Agent("billing")
    agent.add_handler("charge", _noop)
    agent.add_handler("refund", _noop)
    return agent


def _wf(name: str = "order", version: int = 1, *steps: Step) -> Workflow:
    return Workflow(name, list(steps) or [Step("pay", "billing", "charge")], version=version)


def test_registry_exposes_workflows_and_agents() -> None:
    """A valid registry lists what it was built from."""
    agent = _python_agent()
    wf = _wf()
    registry = Registry([wf], [agent])

    assert (wf,) == registry.workflows
    assert (agent,) == registry.agents
    assert agent is registry.agent("billing")


def test_unknown_agent_in_a_step_is_rejected_listing_known_agents() -> None:
    """A step naming an unregistered agent fails and the message lists the known ones."""
    wf = _wf("order", 1, Step("ship", "shipping", "send"))

    with pytest.raises(DefinitionError) as info:
        Registry([wf], [_python_agent(), ExternalAgent("audit")])

    assert str(info.value) == (
        "workflow 'order' v1, step 'ship': unknown agent 'shipping' (known: audit, billing)"
    )


def test_unknown_agent_without_any_agent_says_none_known() -> None:
    """With no agents registered the message says so."""
    with pytest.raises(DefinitionError, match=r"unknown agent 'billing' \(known: none\)"):
        Registry([_wf()])


def test_unknown_action_of_a_python_agent_is_rejected_listing_its_actions() -> None:
    """A step naming an action the agent has no handler for fails, listing the actions."""
    wf = _wf("order", 1, Step("pay", "billing", "steal"))

    with pytest.raises(DefinitionError) as info:
        Registry([wf], [_python_agent()])

    assert str(info.value) == (
        "workflow 'order' v1, step 'pay': agent 'billing' has no action 'steal' "
        "(it has: charge, refund)"
    )


def test_unknown_compensate_action_of_a_python_agent_is_rejected() -> None:
    """The compensating action is checked against the agent's handlers too."""
    wf = _wf("order", 1, Step("pay", "billing", "charge", compensate="undo"))

    with pytest.raises(DefinitionError, match=r"agent 'billing' has no action 'undo'"):
        Registry([wf], [_python_agent()])


def test_known_compensate_action_is_accepted() -> None:
    """A compensating action the agent handles is valid."""
    wf = _wf("order", 1, Step("pay", "billing", "charge", compensate="refund"))

    assert (wf,) == Registry([wf], [_python_agent()]).workflows


def test_agent_without_handlers_reports_none() -> None:
    """An agent with no handlers is reported as having none."""
    with pytest.raises(DefinitionError, match=r"\(it has: none\)"):
        Registry([_wf()], [Agent("billing")])


def test_external_agent_without_actions_accepts_any_action() -> None:
    """ExternalAgent(actions=None) serves whatever action a step names, compensation included."""
    wf = _wf("order", 1, Step("pay", "billing", "anything", compensate="whatever"))

    assert (wf,) == Registry([wf], [ExternalAgent("billing")]).workflows


def test_external_agent_with_actions_is_checked() -> None:
    """An ExternalAgent that declares its actions is checked like a Python agent."""
    wf = _wf("order", 1, Step("pay", "billing", "steal"))

    with pytest.raises(DefinitionError, match=r"has no action 'steal' \(it has: charge\)"):
        Registry([wf], [ExternalAgent("billing", frozenset({"charge"}))])


def test_duplicate_agent_name_is_rejected() -> None:
    """Two agents with one name are a DefinitionError naming it."""
    with pytest.raises(DefinitionError, match=r"duplicate agent name 'billing'"):
        Registry([], [_python_agent(), ExternalAgent("billing")])


def test_bad_agent_name_is_rejected() -> None:
    """An external agent's name is checked against the name pattern."""
    with pytest.raises(DefinitionError, match=r"agent name 'bad name'"):
        Registry([], [ExternalAgent("bad name")])


def test_duplicate_workflow_version_is_rejected() -> None:
    """The same (name, version) twice is a DefinitionError naming both."""
    with pytest.raises(DefinitionError, match=r"workflow 'order' version 2 is registered twice"):
        Registry([_wf("order", 2), _wf("order", 2)], [_python_agent()])


def test_workflow_lookup_without_version_returns_the_latest() -> None:
    """Without a version the highest registered version is returned, whatever the order."""
    v1, v3, v2 = _wf("order", 1), _wf("order", 3), _wf("order", 2)
    registry = Registry([v1, v3, v2, _wf("other", 9)], [_python_agent()])

    assert v3 is registry.workflow("order")


def test_workflow_lookup_with_version_returns_that_version() -> None:
    """An explicit version returns exactly that definition."""
    v1, v2 = _wf("order", 1), _wf("order", 2)
    registry = Registry([v1, v2], [_python_agent()])

    assert v1 is registry.workflow("order", 1)
    assert v2 is registry.workflow("order", 2)


def test_unknown_workflow_name_raises_unknown_workflow_error() -> None:
    """An unregistered name raises UnknownWorkflowError naming it."""
    registry = Registry([_wf()], [_python_agent()])

    with pytest.raises(UnknownWorkflowError, match=r"unknown workflow 'missing'"):
        registry.workflow("missing")


def test_unknown_workflow_version_raises_unknown_workflow_error() -> None:
    """A registered name at an unregistered version raises UnknownWorkflowError."""
    registry = Registry([_wf("order", 1)], [_python_agent()])

    with pytest.raises(UnknownWorkflowError, match=r"unknown workflow 'order' version 5"):
        registry.workflow("order", 5)


def test_unknown_agent_lookup_raises_definition_error() -> None:
    """Registry.agent of an unknown name raises DefinitionError naming it."""
    with pytest.raises(DefinitionError, match=r"unknown agent 'nobody'"):
        Registry().agent("nobody")


def test_library_errors_share_one_root() -> None:
    """Registry and app-loading errors derive from SasflowError."""
    assert all(
        issubclass(e, SasflowError) for e in (DefinitionError, UnknownWorkflowError, AppLoadError)
    )


# -- load_registry ------------------------------------------------------------------------------

APP = "tests.unit.sample_app"


def test_load_registry_from_module_uses_the_registry_attribute() -> None:
    """`module` alone loads the module's `registry` attribute."""
    registry = load_registry(APP)

    assert [w.name for w in registry.workflows] == ["default-attr"]


def test_load_registry_from_module_and_attribute() -> None:
    """`module:attr` loads the named attribute."""
    registry = load_registry(f"{APP}:other")

    assert [w.name for w in registry.workflows] == ["named-attr"]


def test_load_registry_calls_a_factory() -> None:
    """An attribute that is a callable is called and its Registry returned."""
    registry = load_registry(f"{APP}:make_registry")

    assert [w.name for w in registry.workflows] == ["from-factory"]


def test_load_registry_rejects_an_attribute_that_is_not_a_registry() -> None:
    """A non-Registry attribute is an AppLoadError naming the spec and the type found."""
    with pytest.raises(AppLoadError) as info:
        load_registry(f"{APP}:not_a_registry")

    assert f"{APP}:not_a_registry is a int, expected a sasflow.Registry" == str(info.value)


def test_load_registry_rejects_a_factory_returning_something_else() -> None:
    """A factory that does not return a Registry is an AppLoadError."""
    with pytest.raises(AppLoadError, match=r"is a str, expected a sasflow.Registry"):
        load_registry(f"{APP}:make_nothing")


def test_load_registry_missing_module_is_an_app_load_error() -> None:
    """A module that cannot be imported is an AppLoadError naming it."""
    with pytest.raises(AppLoadError, match=r"cannot import app module 'tests.unit.no_such_app'"):
        load_registry("tests.unit.no_such_app")


def test_load_registry_missing_attribute_is_an_app_load_error() -> None:
    """A module without the attribute is an AppLoadError naming both."""
    with pytest.raises(AppLoadError) as info:
        load_registry(f"{APP}:nothing_here")

    assert f"app module {APP!r} has no attribute 'nothing_here'" == str(info.value)


def test_load_object_without_module_is_an_app_load_error() -> None:
    """`:attr` without a module name is rejected with the expected form."""
    with pytest.raises(AppLoadError, match=r"expected MODULE or MODULE:ATTRIBUTE"):
        load_object(":registry")


def test_load_object_returns_any_attribute() -> None:
    """load_object returns the attribute as is, without the Registry check."""
    assert load_object(f"{APP}:not_a_registry") == 42


def test_unknown_names_come_with_what_is_registered() -> None:
    """The message names what was asked for; the hint (shown by the CLI) what there is."""
    registry = Registry([_wf("order", 1), _wf("order", 2), _wf("refund", 1)], [_python_agent()])

    with pytest.raises(UnknownWorkflowError) as name:
        registry.workflow("ordr")
    with pytest.raises(UnknownWorkflowError) as version:
        registry.workflow("order", 7)
    with pytest.raises(DefinitionError) as agent:
        registry.agent("nobody")

    assert (str(name.value), name.value.hint) == (
        "unknown workflow 'ordr'",
        "known workflows: order, refund",
    )
    assert (str(version.value), version.value.hint) == (
        "unknown workflow 'order' version 7",
        "registered versions of 'order': 1, 2",
    )
    assert str(agent.value) == f"unknown agent 'nobody' (known agents: {_python_agent().name})"


def test_a_long_list_of_names_is_cut_with_how_many_more() -> None:
    assert names_list([]) == "none"
    assert names_list(f"w{i:02}" for i in range(LISTED_NAMES)).endswith(f"w{LISTED_NAMES - 1}")
    many = names_list(f"w{i:02}" for i in range(LISTED_NAMES + 3))
    assert many.endswith(f"w{LISTED_NAMES - 1:02} and 3 more")
