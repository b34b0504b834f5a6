"""The tutorial's app: a sign-up workflow, its two agents, and a switch that breaks the mail
service. Load it with `SASFLOW_APP=examples.tutorial.app` (from the repository root)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sasflow import Backoff, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call

accounts = Agent("accounts")
mailer = Agent("mailer")


def mail_outage() -> Path:
    """While this file exists, the mail service takes connections and never answers."""
    return Path(os.environ.get("TUTORIAL_MAIL_OUTAGE", "mail-outage"))


@accounts.handler("create")
def create_account(call: Call) -> dict[str, Any]:
    # A real handler calls the account service here, passing call.idempotency_key along so
    # that a retried attempt cannot create a second account.
    return {"account": f"acct-{call.idempotency_key[:8]}", "email": call.input["email"]}


@mailer.handler("send")
def send_welcome(call: Call) -> dict[str, Any]:
    # The outage: the call hangs until the service is back or the agent gives up at the
    # step's deadline (call.cancelled is set then) and, as the pattern says, replies nothing.
    while mail_outage().exists():
        if call.cancelled.wait(0.2):
            raise TimeoutError("the mail service did not answer")
    return {"sent_to": call.input["email"], "message_id": f"msg-{call.idempotency_key[:8]}"}


def _welcome_input(ctx: StepContext) -> dict[str, Any]:
    return {"email": ctx.outputs["account"]["email"], "account": ctx.outputs["account"]["account"]}


# Short deadlines so the tutorial moves fast: a silent agent is noticed after 3 s, retried
# after 1 s then 2 s, and the third silent attempt fails the run.
QUICK = StepPolicy(timeout=3, max_failures=3, backoff=Backoff(initial=1, maximum=5))

signup = Workflow(
    "signup",
    [
        Step("account", "accounts", "create", policy=QUICK),
        Step("welcome", "mailer", "send", input=_welcome_input, policy=QUICK),
    ],
)

registry = Registry(workflows=[signup], agents=[accounts, mailer])
