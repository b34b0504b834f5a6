"""What every console page shares: the templates, who is signed in, the CSRF check, the
error page, and the runs filter as it travels in query strings and forms."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.exceptions import HTTPException

from sasflow.api.auth import Principal
from sasflow.api.console.flash import FlashCodec
from sasflow.api.console.session import Session, SessionCodec, anonymous
from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import to_response
from sasflow.errors import SasflowError
from sasflow.ops import tokens
from sasflow.ops.runs import RunFilter
from sasflow.states import RunState
from sasflow.store.db import Connection

PREFIX = "/ui"
T = TypeVar("T")
PAGE = 50
"""Runs on one page of the runs list."""


class ConsoleError(Exception):
    """An error the console answers with its error page (HTTP `status`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Console:
    """The console's parts, one per app (on `app.state.console`)."""

    templates: Jinja2Templates
    codec: SessionCodec
    flash: FlashCodec


def install(app: FastAPI, ctx: ApiContext) -> Console:
    """Serve the static files and the error page, and keep the console's parts on the app."""
    env = Environment(
        loader=PackageLoader("sasflow.api.console", "templates"),
        autoescape=select_autoescape(default=True),
    )
    env.filters["when"] = when
    env.filters["pretty"] = pretty
    secret = ctx.settings.api_session_secret
    key = secret.get_secret_value().encode() if secret else secrets.token_bytes(32)
    console = Console(Jinja2Templates(env=env), SessionCodec(key), FlashCodec(key))
    app.state.console = console
    app.mount(
        f"{PREFIX}/static",
        # An editable install links the files (strict mode): follow the links.
        StaticFiles(packages=[("sasflow.api.console", "static")], follow_symlink=True),
        name="console-static",
    )
    app.add_exception_handler(ConsoleError, _error_page)
    return console


def console_of(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


def when(value: Any) -> str:
    """A timestamp as people read it (UTC, to the second)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)


def pretty(value: Any) -> str:
    """JSON, indented."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@dataclass(frozen=True)
class Visitor:
    """Who is looking: the session, and the principal once signed in."""

    session: Session
    principal: Principal | None = None

    @property
    def may_operate(self) -> bool:
        return self.principal is not None and self.principal.may("operate")


def visitor(request: Request, ctx: Annotated[ApiContext, Depends(get_context)]) -> Visitor:
    """The request's visitor: a session whose token is still live, else an anonymous one."""
    session = console_of(request).codec.read(request)
    if session is None:
        return Visitor(anonymous())
    if session.token_hash is None:
        return Visitor(session)
    token_hash = session.token_hash
    found = ctx.transaction(lambda conn: tokens.authenticate_hash(conn, token_hash))
    if found is None or not tokens.grants(found["scopes"], "read"):
        return Visitor(Session(session.csrf))
    principal = Principal(int(found["id"]), str(found["name"]), frozenset(found["scopes"]))
    return Visitor(session, principal)


def reader(request: Request, who: Annotated[Visitor, Depends(visitor)]) -> Visitor:
    """A signed-in visitor, or a redirect to the login page."""
    if who.principal is None:
        target = urlencode({"next": request.url.path})
        raise HTTPException(303, "sign in first", headers={"Location": f"{PREFIX}/login?{target}"})
    return who


def checked(
    who: Annotated[Visitor, Depends(visitor)], csrf: Annotated[str | None, Form()] = None
) -> Visitor:
    """The visitor of a form post whose CSRF token matches the session's (else 403)."""
    if not who.session.csrf_matches(csrf):
        raise ConsoleError(403, "the form's CSRF token is missing or wrong: reload the page")
    return who


def operator(
    request: Request, who: Annotated[Visitor, Depends(checked)]
) -> tuple[Visitor, Principal]:
    """A signed-in visitor whose token has the `operate` scope, posting a checked form."""
    signed_in = reader(request, who)
    if signed_in.principal is None or not signed_in.may_operate:
        raise ConsoleError(403, "your token lacks the 'operate' scope: it can look, not act")
    return signed_in, signed_in.principal


def render(
    request: Request,
    who: Visitor,
    template: str,
    values: Mapping[str, Any],
    *,
    status: int = 200,
) -> HTMLResponse:
    """A page, with the visitor, the CSRF token and the state names at hand, and the message
    an action left for it (`flash`; given in `values` by a page that is itself a result)."""
    console = console_of(request)
    context = {
        "who": who,
        "csrf": who.session.csrf,
        "run_states": list(RunState),
        "flash": console.flash.pending(request),
        **values,
    }
    response = console.templates.TemplateResponse(request, template, context, status_code=status)
    console.codec.write(request, response, who.session)
    console.flash.clear(request, response)
    return response


def act(ctx: ApiContext, work: Callable[[Connection], T]) -> T:
    """Run a service function in a transaction; its refusal (409, 400, 404...) becomes the
    error page, with the status and message the REST API would answer."""
    try:
        return ctx.transaction(work)
    except SasflowError as exc:
        answer = to_response(exc)
        raise ConsoleError(answer.status_code, json.loads(bytes(answer.body))["message"]) from exc


def local(target: str) -> str:
    """Where to go after login: a console path only (never another site)."""
    return target if target.startswith(PREFIX) and not target.startswith("//") else PREFIX


def redirect(
    request: Request, who: Visitor, location: str, *, flash: str | None = None
) -> RedirectResponse:
    """303 See Other (after a post), keeping the session cookie fresh; `flash` is the
    one-time message the page at `location` shows (what the action did)."""
    response = RedirectResponse(location, status_code=303)
    console_of(request).codec.write(request, response, who.session)
    if flash:
        console_of(request).flash.put(request, response, flash)
    return response


async def _error_page(request: Request, exc: Exception) -> HTMLResponse:
    assert isinstance(exc, ConsoleError)  # noqa: S101 - registered for ConsoleError only
    who = Visitor(console_of(request).codec.read(request) or anonymous())
    return render(request, who, "error.html", {"message": exc.message}, status=exc.status)


# -- the runs filter -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunQuery:
    """The runs filter of the runs page, as its query string and hidden form fields say."""

    states: tuple[str, ...] = ()
    workflow: str = ""
    key: str = ""
    text: str = ""
    since: str = ""
    until: str = ""
    ids: tuple[int, ...] = field(default=())

    def to_filter(self, limit: int) -> RunFilter:
        """The store's filter; an unknown state or a malformed time -> ConsoleError 400."""
        unknown = [s for s in self.states if s not in set(RunState)]
        if unknown:
            raise ConsoleError(400, f"unknown run state {unknown[0]!r}")
        return RunFilter(
            states=self.states,
            workflow=self.workflow or None,
            key=self.key or None,
            text=self.text or None,
            since=_moment(self.since, "from"),
            until=_moment(self.until, "until"),
            ids=self.ids,
            limit=limit,
        )

    def params(self) -> list[tuple[str, str]]:
        """The filter as query parameters (for links and hidden fields)."""
        found = [("state", s) for s in self.states]
        named = ("workflow", "key", "text", "since", "until")
        found.extend((name, getattr(self, name)) for name in named if getattr(self, name))
        return found

    def query_string(self) -> str:
        return urlencode(self.params())


def _moment(value: str, what: str) -> datetime | None:
    """A datetime-local field's value, read as UTC."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    except ValueError:
        raise ConsoleError(400, f"the {what} time {value!r} is not YYYY-MM-DDTHH:MM") from None
