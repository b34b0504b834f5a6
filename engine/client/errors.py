"""The SDK's error: what the API answered when a call failed."""

from __future__ import annotations

import httpx

from sasflow.errors import SasflowError


class ApiError(SasflowError):
    """The API answered a call with an error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def of(cls, response: httpx.Response) -> ApiError:
        """The error a non-2xx response carries (`{"error": code, "message": ...}`)."""
        try:
            body = response.json()
            return cls(response.status_code, str(body["error"]), str(body["message"]))
        except (ValueError, KeyError, TypeError):
            return cls(response.status_code, "http_error", response.text[:500])
