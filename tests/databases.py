"""Each test's own database, made ahead and dropped behind by one background thread.

A clone of the migrated template (CREATE DATABASE ... TEMPLATE) takes 0.1-0.5 s and its
DROP DATABASE up to 0.3 s: paid in the setup and teardown of some 240 tests, that was over a
minute of the suite. Here a thread keeps `ahead` fresh clones ready and drops the ones the
tests gave back while the tests run, so a test still gets a database no other test touched,
and gives it back as before, without waiting for either statement.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator

import psycopg

from tests import services


class DatabasePool:
    """Fresh clones of `template` owned by `owner`: `take()` one, `give_back()` it when the
    test is done with it; `close()` drops every clone still around."""

    def __init__(self, template: str, owner: str, ahead: int = 2) -> None:
        self._template = template
        self._owner = owner
        # Read once, here: a test may point SASFLOW_DATABASE_URL elsewhere (monkeypatch)
        # while the thread works.
        self._admin = services.admin_url()
        self._ahead = ahead
        self._ready: queue.Queue[str | psycopg.Error] = queue.Queue()
        self._made = 0
        """Clones being made or ready and not taken yet: what `ahead` bounds."""
        self._dropping: list[str] = []
        self._errors: list[psycopg.Error] = []
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="database-pool", daemon=True)
        self._thread.start()

    def take(self, timeout: float = 120.0) -> str:
        """A clone nobody used; raises what the thread met making it (PostgreSQL down...)."""
        try:
            found = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no database cloned from {self._template} in {timeout}s") from None
        with self._work:
            self._made -= 1
            self._work.notify()
        if isinstance(found, psycopg.Error):
            raise found
        return found

    def give_back(self, name: str) -> None:
        """Drop `name` in the background (WITH FORCE: sessions a test left are ended)."""
        with self._work:
            self._dropping.append(name)
            self._work.notify()

    def close(self) -> None:
        """Drop the clones given back and those never taken; raises the first drop error."""
        with self._work:
            self._closing = True
            self._work.notify()
        self._thread.join()
        while True:
            try:
                found = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(found, str):
                self._drop(found)
        if self._errors:
            raise self._errors[0]

    def _next(self) -> tuple[str, str | None] | None:
        """What the thread does next: make a clone (a test may be waiting for it) before
        dropping one; None once closing and nothing is left to drop."""
        with self._work:
            while True:
                if not self._closing and self._made < self._ahead:
                    self._made += 1
                    return "make", None
                if self._dropping:
                    return "drop", self._dropping.pop(0)
                if self._closing:
                    return None
                self._work.wait()

    def _run(self) -> None:
        while (work := self._next()) is not None:
            what, name = work
            if what == "make":
                self._ready.put(self._make())
            elif name is not None:
                self._drop(name)

    def _make(self) -> str | psycopg.Error:
        name = services.unique("sasflow_test")
        try:
            services.create_database(
                name, template=self._template, owner=self._owner, admin=self._admin
            )
        except psycopg.Error as exc:  # handed to the test that takes it
            return exc
        return name

    def _drop(self, name: str) -> None:
        try:
            services.drop_database(name, admin=self._admin)
        except psycopg.Error as exc:  # reported at close, with the session's teardown
            self._errors.append(exc)


@contextlib.contextmanager
def pool(template: str, owner: str) -> Iterator[DatabasePool]:
    databases = DatabasePool(template, owner)
    try:
        yield databases
    finally:
        databases.close()
