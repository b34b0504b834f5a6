"""Refused forms shown again: the error names the field it is about, and the page that holds
the form is rendered anew with what the user typed and the error next to that field (status
400, 409...), instead of an error page that loses the input."""

from __future__ import annotations

from sasflow.api.console.views import ConsoleError

FORM = "form"
"""The errors' key of a refusal about the whole form (a 409 of the service function)."""


class FieldError(ConsoleError):
    """A refused value of one field of a form (HTTP `status`, 400 by default)."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(status, message)
        self.field = field


def errors_of(exc: ConsoleError) -> dict[str, str]:
    """Field name (or FORM) -> message, as the templates show it."""
    return {exc.field if isinstance(exc, FieldError) else FORM: exc.message}


def reason(text: str, field: str = "reason") -> str:
    """A required reason, stripped; a blank one is refused on its field."""
    if not text.strip():
        raise FieldError(field, "a reason is required")
    return text.strip()
