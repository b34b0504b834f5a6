"""Workflow definitions: dependency resolution, ordering, outputs and definition errors."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow.errors import DefinitionError
from sasflow.policy import StepPolicy
from sasflow.states import OnExhausted
from sasflow.store import schema
from sasflow.workflow import TIMER_AGENT, Step, StepContext, Workflow, check_name


def _ctx(outputs: dict[str, Any], run_input: Any = None) -> StepContext:
    return StepContext(run_input=run_input, outputs=outputs, run_id=1, business_key="k")


def _diamond() -> Workflow:
    return Workflow(
        "diamond",
        [
            Step("start", "svc", "go"),
            Step("left", "svc", "go", after=("start",)),
            Step("right", "svc", "go", after=("start",)),
            Step("end", "svc", "go", after=("left", "right")),
        ],
    )


def test_steps_without_after_form_a_sequence() -> None:
    """after=None (the default) makes each step follow the one declared before it."""
    wf = Workflow("seq", [Step("a", "svc", "x"), Step("b", "svc", "x"), Step("c", "svc", "x")])

    assert wf.dependencies == {"a": (), "b": ("a",), "c": ("b",)}
    assert wf.order == ("a", "b", "c")
    assert wf.terminal_steps == ("c",)


def test_after_empty_tuple_makes_a_root() -> None:
    """after=() makes a step a root even when another step is declared before it."""
    wf = Workflow("roots", [Step("a", "svc", "x"), Step("b", "svc", "x", after=())])

    assert wf.dependencies == {"a": (), "b": ()}
    assert wf.terminal_steps == ("a", "b")


def test_fan_out_and_fan_in_dependencies_successors_and_sinks() -> None:
    """A diamond: one step fans out to two, which fan back into one sink."""
    wf = _diamond()

    assert wf.dependencies["end"] == ("left", "right")
    assert wf.successors == {
        "start": ("left", "right"),
        "left": ("end",),
        "right": ("end",),
        "end": (),
    }
    assert wf.terminal_steps == ("end",)


def test_topological_order_puts_dependencies_first_and_keeps_declaration_order() -> None:
    """Steps declared before their dependencies are still ordered after them."""
    wf = Workflow(
        "late",
        [
            Step("final", "svc", "x", after=("second", "first")),
            Step("second", "svc", "x", after=("first",)),
            Step("first", "svc", "x", after=()),
            Step("other", "svc", "x", after=()),
        ],
    )

    assert wf.order == ("first", "other", "second", "final")


def test_sinks_follow_topological_order() -> None:
    """Several sinks are listed in topological order."""
    wf = Workflow(
        "two-sinks",
        [
            Step("b", "svc", "x", after=("a",)),
            Step("a", "svc", "x", after=()),
            Step("c", "svc", "x", after=("a",)),
        ],
    )

    assert wf.terminal_steps == ("b", "c")
    assert wf.successors["a"] == ("b", "c")


def test_default_output_is_the_sinks_outputs() -> None:
    """Without an output function the run's output maps each sink to its output."""
    wf = Workflow(
        "fan",
        [
            Step("a", "svc", "x", after=()),
            Step("b", "svc", "x", after=("a",)),
            Step("c", "svc", "x", after=("a",)),
        ],
    )

    assert wf.output(_ctx({"a": 1, "b": 2, "c": 3})) == {"b": 2, "c": 3}


def test_default_output_names_a_sink_without_output_as_none() -> None:
    """A sink missing from the outputs appears with None."""
    wf = Workflow("one", [Step("a", "svc", "x")])

    assert wf.output(_ctx({})) == {"a": None}


def test_custom_output_function_is_used() -> None:
    """An output function receives the context and its result is the run's output."""
    wf = Workflow(
        "custom",
        [Step("a", "svc", "x"), Step("b", "svc", "x")],
        output=lambda ctx: {"total": ctx.outputs["a"] + ctx.outputs["b"], "in": ctx.run_input},
    )

    assert wf.output(_ctx({"a": 2, "b": 3}, run_input="r")) == {"total": 5, "in": "r"}


def test_default_step_input_is_the_run_input() -> None:
    """A step without an input builder receives the run's input."""
    step = Step("a", "svc", "x")

    assert step.input(_ctx({}, run_input={"order": 7})) == {"order": 7}


def test_step_lookup_by_name() -> None:
    """Workflow.step returns the named step and raises KeyError for an unknown one."""
    wf = _diamond()

    assert wf.step("left").name == "left"
    with pytest.raises(KeyError, match="nope"):
        wf.step("nope")


def test_repr_names_workflow_version_and_order() -> None:
    """The repr shows the name, version and steps in order."""
    wf = Workflow("seq", [Step("a", "svc", "x"), Step("b", "svc", "x")], version=2)

    assert repr(wf) == "Workflow('seq', version=2, steps=['a', 'b'])"


def test_duplicate_step_name_is_rejected_and_named() -> None:
    """Two steps with one name are a DefinitionError naming the step."""
    with pytest.raises(DefinitionError, match=r"duplicate step name 'a'"):
        Workflow("dup", [Step("a", "svc", "x"), Step("a", "svc", "y")])


def test_unknown_dependency_is_rejected_and_named() -> None:
    """A dependency on an undeclared step names both the step and the missing dependency."""
    with pytest.raises(DefinitionError, match=r"step 'b' depends on unknown step 'ghost'"):
        Workflow("unk", [Step("a", "svc", "x"), Step("b", "svc", "x", after=("ghost",))])


def test_self_dependency_is_rejected_and_named() -> None:
    """A step listing itself as a dependency is a DefinitionError naming it."""
    with pytest.raises(DefinitionError, match=r"step 'a' depends on itself"):
        Workflow("self", [Step("a", "svc", "x", after=("a",))])


def test_cycle_is_rejected_and_lists_the_steps() -> None:
    """A dependency cycle is a DefinitionError listing the steps on it."""
    with pytest.raises(DefinitionError, match="dependency cycle") as info:
        Workflow(
            "cyc",
            [
                Step("root", "svc", "x", after=()),
                Step("a", "svc", "x", after=("root", "c")),
                Step("b", "svc", "x", after=("a",)),
                Step("c", "svc", "x", after=("b",)),
            ],
        )

    message = str(info.value)
    assert message.startswith("workflow 'cyc': dependency cycle among steps: ")
    assert {"a", "b", "c"} == set(message.rsplit(": ", 1)[1].split(" -> "))


def test_cycle_message_names_only_the_steps_on_the_cycle() -> None:
    """A step that merely depends on a cycle is not listed as part of it."""
    with pytest.raises(DefinitionError, match="dependency cycle") as info:
        Workflow(
            "cyc",
            [
                Step("a", "svc", "x", after=("b",)),
                Step("b", "svc", "x", after=("a",)),
                Step("downstream", "svc", "x", after=("b",)),
            ],
        )

    assert {"a", "b"} == set(str(info.value).rsplit(": ", 1)[1].split(" -> "))


def test_dependency_listed_twice_is_rejected_and_named() -> None:
    """Listing the same dependency twice is a DefinitionError naming the step."""
    with pytest.raises(DefinitionError, match=r"step 'b' lists a dependency twice"):
        Workflow("twice", [Step("a", "svc", "x"), Step("b", "svc", "x", after=("a", "a"))])


def test_empty_workflow_is_rejected() -> None:
    """A workflow needs at least one step."""
    with pytest.raises(DefinitionError, match=r"workflow 'empty' has no steps"):
        Workflow("empty", [])


@pytest.mark.parametrize("version", [0, -1])
def test_version_below_one_is_rejected(version: int) -> None:
    """Versions start at 1; the message names the workflow and the bad version."""
    with pytest.raises(DefinitionError, match=rf"'v': version must be >= 1, got {version}"):
        Workflow("v", [Step("a", "svc", "x")], version=version)


def test_invalid_on_failure_is_rejected() -> None:
    """on_failure is 'error' or 'compensate'."""
    with pytest.raises(DefinitionError, match="on_failure"):
        Workflow("f", [Step("a", "svc", "x")], on_failure="explode")  # type: ignore[arg-type]


def test_on_failure_compensate_is_kept() -> None:
    """A valid on_failure is stored on the workflow."""
    wf = Workflow("f", [Step("a", "svc", "x", compensate="undo")], on_failure="compensate")

    assert wf.on_failure == "compensate"


@pytest.mark.parametrize("bad", ["", "has space", "-leading-dash", "x" * 101, "é", "a/b"])
def test_bad_workflow_name_is_rejected_and_named(bad: str) -> None:
    """A workflow name outside the pattern is a DefinitionError quoting the name."""
    with pytest.raises(DefinitionError, match="workflow name") as info:
        Workflow(bad, [Step("a", "svc", "x")])

    assert repr(bad) in str(info.value)


@pytest.mark.parametrize(
    ("step", "what"),
    [
        (Step("bad name", "svc", "x"), "step name 'bad name'"),
        (Step("a", "bad agent", "x"), "agent name 'bad agent'"),
        (Step("a", "svc", "bad action"), "action name 'bad action'"),
        (Step("a", "svc", "x", compensate="bad undo"), "compensate name 'bad undo'"),
    ],
)
def test_bad_step_agent_action_or_compensate_name_is_rejected_and_named(
    step: Step, what: str
) -> None:
    """Each name a step carries is checked, and the message says which one is wrong."""
    with pytest.raises(DefinitionError) as info:
        Workflow("wf", [step])

    assert what in str(info.value)


@pytest.mark.parametrize("good", ["a", "_x", "0", "Order.v2-final_x", "x" * 100])
def test_valid_names_are_accepted(good: str) -> None:
    """Letters, digits, '_', '.', '-' up to 100 characters are valid names."""
    check_name("workflow", good)


def test_name_with_trailing_newline_is_rejected() -> None:
    """A name ending in a newline cannot be used in a queue name or routing key."""
    with pytest.raises(DefinitionError):
        check_name("agent", "billing\n")


def test_workflow_steps_are_immutable_tuple() -> None:
    """The steps given as a list are kept as a tuple, unaffected by later list changes."""
    steps = [Step("a", "svc", "x")]
    wf = Workflow("imm", steps)
    steps.append(Step("b", "svc", "x"))

    assert tuple(s.name for s in wf.steps) == ("a",)


def test_a_timer_step_is_declared_with_step_sleep_and_is_never_a_root() -> None:
    nap = Workflow("nap", [Step("a", "svc", "go"), Step.sleep("wait", seconds=1)])
    assert nap.step("wait").is_timer
    assert nap.step("wait").sleep_s == 1.0
    with pytest.raises(DefinitionError, match="cannot be a root step"):
        Workflow("nap", [Step.sleep("wait", seconds=1), Step("a", "svc", "go")])
    with pytest.raises(DefinitionError, match="exactly one of seconds and until"):
        Step.sleep("wait")
    with pytest.raises(DefinitionError, match="seconds must be >= 0"):
        Step.sleep("wait", seconds=-1)
    with pytest.raises(DefinitionError, match="reserved for timer steps"):
        Workflow("nap", [Step("a", "svc", "go"), Step("b", "sasflow.timer", "sleep")])


def test_a_timers_sleep_is_part_of_the_fingerprint_and_other_steps_keep_theirs() -> None:
    def nap(seconds: float) -> Workflow:
        return Workflow("nap", [Step("a", "svc", "go"), Step.sleep("wait", seconds=seconds)])

    assert nap(1).fingerprint != nap(2).fingerprint
    assert "sleep_s" not in Step("a", "svc", "go").shape()


def test_the_partial_indexes_name_the_timer_agent() -> None:
    """ix_steps_ready leaves timers out and ix_steps_timers holds them by the agent's name,
    spelt in their SQL predicates."""
    indexes = {str(i.name): i for i in schema.steps.indexes}
    for name in ("ix_steps_ready", "ix_steps_timers"):
        predicate = str(indexes[name].dialect_options["postgresql"]["where"])
        assert f"'{TIMER_AGENT}'" in predicate, (name, predicate)


def test_which_steps_park_the_workflow_says_and_a_step_policy_overrides() -> None:
    """`on_exhausted` and `on_error` of the workflow, overridden by a step's policy; a
    permanent error does what running out of failures does unless told otherwise."""
    steps = [
        Step("plain", "svc", "go"),
        Step("fails", "svc", "go", policy=StepPolicy(on_exhausted="fail")),
        Step("errors_park", "svc", "go", policy=StepPolicy(on_error="park")),
    ]
    default = Workflow("w", steps)
    parking = Workflow("w", steps, on_exhausted="park")
    errors_fail = Workflow("w", steps, on_exhausted=OnExhausted.PARK, on_error="fail")
    assert [default.parks(s.name) for s in steps] == [(False, False), (False, False), (False, True)]
    assert [parking.parks(s.name) for s in steps] == [(True, True), (False, False), (True, True)]
    assert [errors_fail.parks(s.name) for s in steps] == [
        (True, False),
        (False, False),
        (True, True),
    ]
    with pytest.raises(DefinitionError, match="on_exhausted must be 'fail' or 'park'"):
        Workflow("w", steps, on_exhausted="retry")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="on_error must be 'fail' or 'park'"):
        StepPolicy(on_error="ignore")  # type: ignore[arg-type]
