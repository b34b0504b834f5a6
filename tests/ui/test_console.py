"""The operator console driven in headless Chromium: sign in, filter, resubmit from the run
page (the step really runs again), a bulk dry run that matches the real bulk action, cancel,
acknowledge an alert, CSRF refusal, a `read` token that cannot act, and pause/resume/trigger
a schedule and drain/undrain a scheduler."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import Engine, select

from sasflow.ops import limits as limit_ops
from sasflow.schedules.definition import Schedule
from sasflow.states import RunState
from sasflow.store.db import run_transaction
from sasflow.store.flow.model import Limit
from sasflow.store.outbox.alerts import Alert, AlertKind, raise_alert
from sasflow.store.schema import audit, events
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.cluster import add_schedule, register_scheduler
from tests.api.server import ApiServer, make_token
from tests.apps import ops
from tests.ui.conftest import PHONE, WIDE
from tests.ui.runs import submit as _submit
from tests.ui.runs import wait_state as _wait_state

pytestmark = [pytest.mark.integration, pytest.mark.ui]


def _running(store: Engine, names: Names, tag: str) -> int:
    """A run whose first step is busy for a few seconds."""
    run_id = _submit(store, names, services.unique(tag), value=1, delay=4)
    _wait_state(store, run_id, RunState.RUNNING)
    return run_id


def _alert(store: Engine, message: str) -> int:
    found = run_transaction(
        store,
        lambda conn: raise_alert(
            conn, Alert(kind=AlertKind.STALLED, subject=services.unique("a"), message=message)
        ),
    )
    assert found is not None
    return found


def _sign_in(page: Page, console: ApiServer, token: str) -> None:
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def _operator(store: Engine) -> tuple[str, str]:
    name = services.unique("ops")
    return name, make_token(store, name, "read", "operate")


def _shoot(page: Page, shots: Path, name: str) -> None:
    """The page at desktop and phone width."""
    for label, size in (("wide", WIDE), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.screenshot(path=shots / f"{name}-{label}.png", full_page=True)
    page.set_viewport_size(WIDE)


def test_sign_in_every_page_and_sign_out(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    """A wrong token is refused; an operator's token opens every page (each photographed at
    1280 px and at a phone's width); signing out ends the session."""
    name, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("shot"), value=3, fail=True)
    _wait_state(store, run_id, RunState.ERROR)
    alert = _alert(store, "shown")
    schedule = add_schedule(
        store, Schedule(services.unique("nightly"), "ops", cron="0 2 * * *"), ops.registry
    )
    register_scheduler(store, services.unique("shown"))
    with store.begin() as conn:  # an agent no test runs: the limit holds none of their steps
        limit_ops.set_limit(
            conn,
            Limit(services.unique("quota"), "payments", rate=100, concurrency=40),
            actor=name,
            reason="the gateway's quota",
            namespace=module_names.namespace,
        )
    page.clock.install()  # the page's timers, run ahead below (time flows as usual meanwhile)
    page.goto(f"{console.base_url}/ui/runs")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fruns$"))
    _shoot(page, shots, "login")
    page.get_by_label("API token").fill("sft_wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("unknown or revoked token")
    _sign_in(page, console, token)
    expect(page.get_by_text(f"{name} (operate, read)")).to_be_visible()
    for asset in ("console.css", "htmx.min.js"):  # served locally, no CDN
        assert page.request.get(f"{console.base_url}/ui/static/{asset}").status == 200
    assert page.evaluate("typeof htmx.version") == "string"
    page.keyboard.press("Tab")  # the first stop of the keyboard
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    with page.expect_response(
        lambda answer: answer.url.endswith("/ui/overview/panel") and answer.ok, timeout=10_000
    ):  # the overview refreshes itself: htmx's poll every 5 s, its timer run 5 s ahead
        page.clock.fast_forward(5_000)
    _shoot(page, shots, "overview")
    for path, heading, shot in (
        ("/ui/runs", "Runs", "runs"),
        (f"/ui/runs/{run_id}", f"Run {run_id} error", "run"),
        ("/ui/alerts", "Alerts", "alerts"),
        (f"/ui/alerts/{alert}", f"Alert #{alert}: stalled", "alert"),
        ("/ui/agents", "Agents", "agents"),
        ("/ui/limits", "Limits", "limits"),
        ("/ui/schedules", "Schedules", "schedules"),
        (f"/ui/schedules/{schedule['id']}", f"Schedule {schedule['name']}", "schedule"),
        ("/ui/schedulers", "Schedulers", "schedulers"),
    ):
        page.goto(console.base_url + path)
        expect(page.get_by_role("heading", level=1)).to_have_text(heading)
        _shoot(page, shots, shot)
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto(f"{console.base_url}/ui/runs")
    expect(page).to_have_url(re.compile(r"/ui/login"))


def test_runs_filter_by_state_and_key_text(
    page: Page, browser: Browser, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Free text on the key and a state narrow the list to the matching runs; the filtered
    list shows the same without JavaScript."""
    tag = services.unique("flt")
    good = _submit(store, module_names, f"{tag}-good", value=1)
    bad = _submit(store, module_names, f"{tag}-bad", value=2, fail=True)
    _wait_state(store, good, RunState.COMPLETED)
    _wait_state(store, bad, RunState.ERROR)
    _sign_in(page, console, _operator(store)[1])
    page.goto(f"{console.base_url}/ui/runs")
    page.get_by_label("Text (key, input, output, errors)").fill(tag)
    page.get_by_role("button", name="Filter", exact=True).click()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(2)
    page.get_by_label("error", exact=True).check()
    page.get_by_role("button", name="Filter", exact=True).click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"{tag}-bad")
    assert f"text={tag}" in page.url
    assert "state=error" in page.url
    filtered = page.url
    plain = browser.new_context(java_script_enabled=False).new_page()
    _sign_in(plain, console, _operator(store)[1])
    plain.goto(filtered)
    expect(plain.locator("tbody tr")).to_have_count(1)
    expect(plain.locator("tbody tr").first).to_contain_text(f"{tag}-bad")
    plain.context.close()


def test_resubmit_with_an_edited_input_reruns_the_failed_step(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Step b failed on a bad input; the operator edits the input on the run page and
    resubmits: b runs again for real and the run completes; the timeline says who and why.
    An input that is not JSON is refused before anything changes."""
    name, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("rs"), value=5, fail=True)
    _wait_state(store, run_id, RunState.ERROR)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    page.get_by_label("Input (JSON object; edit to correct it)").fill("{not json")
    page.get_by_label("Reason for resubmitting").fill("typo")
    page.get_by_role("button", name=f"Resubmit run {run_id}").click()
    expect(page.get_by_role("alert")).to_contain_text("not valid JSON")
    assert harness.run_states(store)[run_id] == RunState.ERROR
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    page.get_by_label("Input (JSON object; edit to correct it)").fill('{"value": 5}')
    page.get_by_label("Reason for resubmitting").fill("input corrected")
    page.get_by_role("button", name=f"Resubmit run {run_id}").click()
    _wait_state(store, run_id, RunState.COMPLETED)
    b = next(s for s in harness.step_rows(store, run_id) if s.name == "b")
    assert (b.state, b.output["seen"]) == ("processed", 5)
    page.reload()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Run {run_id} completed")
    expect(page.get_by_role("cell", name="resubmitted: input corrected").first).to_be_visible()
    failures = page.get_by_role("region", name="Failures")
    expect(failures).to_contain_text("PermanentError: remote refused b")  # outlives the fix
    with store.connect() as conn:
        actors = set(
            conn.execute(
                select(events.c.actor).where(
                    events.c.run_id == run_id, events.c.reason == "resubmitted: input corrected"
                )
            ).scalars()
        )
    assert actors == {name}


def test_bulk_dry_run_lists_exactly_what_the_real_bulk_resubmission_does(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Preview by filter lists the failed runs and the steps to redo; confirming resubmits
    exactly those runs and reports the same steps."""
    tag = services.unique("bulk")
    failed = [_submit(store, module_names, f"{tag}-{i}", value=i, fail=True) for i in range(2)]
    done = _submit(store, module_names, f"{tag}-ok", value=9)
    for run_id in failed:
        _wait_state(store, run_id, RunState.ERROR)
    _wait_state(store, done, RunState.COMPLETED)
    _sign_in(page, console, _operator(store)[1])
    page.goto(f"{console.base_url}/ui/runs?text={tag}")
    page.get_by_label(f"Select run {failed[1]}").check()
    page.get_by_role("button", name="Preview resubmitting the selected runs").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: resubmit 1 run(s)")
    assert page.locator("tbody tr").all_inner_texts() == [f"{failed[1]}\tb\tb"]
    page.go_back()
    page.get_by_role("button", name="Preview resubmitting every run the filter matches").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: resubmit 2 run(s)")
    preview = page.locator("tbody tr").all_inner_texts()
    assert [row.split("\t")[:2] for row in preview] == [[str(r), "b"] for r in failed]
    assert {harness.run_states(store)[r] for r in failed} == {RunState.ERROR}  # rolled back
    page.get_by_label("Reason").fill("bulk retry")
    page.get_by_role("button", name="Resubmit these 2 run(s)").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Resubmitted 2 run(s)")
    assert page.locator("tbody tr").all_inner_texts() == preview
    with store.connect() as conn:
        touched = set(
            conn.execute(
                select(events.c.run_id).where(events.c.reason == "resubmitted: bulk retry")
            ).scalars()
        )
    assert touched == set(failed)


def test_cancel_needs_a_reason_and_stops_the_run(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    run_id = _running(store, module_names, "cx")
    _sign_in(page, console, _operator(store)[1])
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    page.get_by_label("Reason for cancelling").fill("not needed any more")
    page.get_by_role("button", name=f"Cancel run {run_id}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Run {run_id} cancelled")
    expect(page.get_by_role("cell", name="cancelled: not needed any more").first).to_be_visible()


def test_acknowledge_an_alert_with_a_note(page: Page, console: ApiServer, store: Engine) -> None:
    name, token = _operator(store)
    alert = _alert(store, "look")
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/alerts")  # grouped by incident: one alert a row
    page.get_by_role("link", name="one alert a row").click()
    page.get_by_role("link", name=f"#{alert}").click()
    page.get_by_label("Note").fill("known outage")
    page.get_by_role("button", name=f"Acknowledge alert #{alert}").click()
    expect(page.get_by_text(f"by {name} at")).to_contain_text("known outage")
    expect(page.get_by_role("button", name=f"Acknowledge alert #{alert}")).to_have_count(0)


def test_a_post_without_the_right_csrf_token_is_refused(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    run_id = _running(store, module_names, "csrf")
    _sign_in(page, console, _operator(store)[1])
    url = f"{console.base_url}/ui/runs/{run_id}/cancel"
    forged: list[dict[str, str | float | bool]] = [
        {"reason": "forged"},
        {"reason": "forged", "csrf": "wrong"},
    ]
    for form in forged:
        answer = page.request.post(url, form=form, max_redirects=0)
        assert answer.status == 403
        assert "CSRF token is missing or wrong" in answer.text()
    assert harness.run_states(store)[run_id] == RunState.RUNNING
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(url, form={"reason": "real", "csrf": csrf or ""}, max_redirects=0)
    assert answer.status == 303
    _wait_state(store, run_id, RunState.CANCELLED)


def test_a_read_token_sees_no_action_and_cannot_post_one(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    run_id = _running(store, module_names, "ro")
    _sign_in(page, console, make_token(store, services.unique("viewer"), "read"))
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Run {run_id} running")
    expect(page.locator("form[action$='/cancel'], form[action$='/resubmit']")).to_have_count(0)
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(
        f"{console.base_url}/ui/runs/{run_id}/cancel",
        form={"reason": "sneaky", "csrf": csrf or ""},
        max_redirects=0,
    )
    assert answer.status == 403
    assert "lacks the &#39;operate&#39; scope" in answer.text()
    assert harness.run_states(store)[run_id] == RunState.RUNNING


def test_pause_resume_trigger_a_schedule_and_drain_undrain_a_scheduler(
    page: Page, console: ApiServer, store: Engine
) -> None:
    """The schedule's buttons pause it, resume it and fire it (its tick links to the run); the
    schedulers page drains and undrains a registered scheduler; each button opens a
    confirmation page first and the page after the action says what it did; each action is
    audited with the signed-in token's name."""
    name, token = _operator(store)
    schedule = add_schedule(
        store,
        Schedule(services.unique("hourly"), "ops", every=3600, input={"value": 2}),
        ops.registry,
    )
    scheduler = services.unique("sch")
    register_scheduler(store, scheduler)
    _sign_in(page, console, token)
    page.get_by_role("navigation").get_by_role("link", name="Schedules").click()
    page.get_by_role("link", name=schedule["name"]).click()
    label = schedule["name"]
    status = page.get_by_role("status")
    page.get_by_role("button", name=f"Pause {label}…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Pause schedule {label}?")
    page.get_by_label("Reason for pausing (optional)").fill("maintenance")
    page.get_by_role("button", name=f"Confirm: pause {label}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Schedule {label} (paused)")
    expect(status).to_have_text(f"Schedule {label} paused")
    page.get_by_role("button", name=f"Resume {label}…").click()
    page.get_by_role("button", name=f"Confirm: resume {label}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Schedule {label}")
    expect(status).to_have_text(f"Schedule {label} resumed")
    page.get_by_role("button", name=f"Trigger {label}…").click()
    page.get_by_role("button", name=f"Confirm: trigger {label}").click()
    expect(status).to_have_text(re.compile(rf"^Schedule {label} triggered: run \d+ submitted$"))
    page.get_by_role("link", name=re.compile(r"^run \d+$")).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"^Run \d+ "))

    page.get_by_role("navigation").get_by_role("link", name="Schedulers").click()
    row = page.get_by_role("row").filter(has_text=scheduler)
    expect(row.locator(".state")).to_have_text("online")
    row.get_by_role("button", name=f"Drain {scheduler}…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Drain scheduler {scheduler}?")
    page.get_by_role("button", name=f"Confirm: drain {scheduler}").click()
    expect(status).to_have_text(f"Scheduler {scheduler} drained")
    expect(row.locator(".state")).to_have_text("drained")
    row.get_by_role("button", name=f"Undrain {scheduler}…").click()
    page.get_by_role("button", name=f"Confirm: undrain {scheduler}").click()
    expect(status).to_have_text(f"Scheduler {scheduler} undrained")
    expect(row.locator(".state")).to_have_text("online")
    with store.connect() as conn:
        done = conn.execute(
            select(audit.c.action, audit.c.reason).where(audit.c.actor == name).order_by(audit.c.id)
        ).all()
    assert [tuple(r) for r in done] == [
        ("schedules.pause", "maintenance"),
        ("schedules.resume", None),
        ("schedules.trigger", None),
        ("schedulers.drain", None),
        ("schedulers.undrain", None),
    ]
