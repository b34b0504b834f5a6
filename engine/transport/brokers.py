"""The broker list: SASFLOW_BROKER_URL holds one broker URL, or several for a cluster.

Entries are separated by commas; whitespace around a comma, and before the first or after the
last entry, is ignored (a list may be wrapped over lines). A comma separates only where the
next entry's `amqp://` or `amqps://` follows it, so a comma in a password needs no escaping;
anywhere else after the password (host, virtual host, options) a comma or a space is refused,
and is written %2C or %20. Every connect tries the entries in a new random order, so that a
fleet's connections spread over the nodes and none waits on the same dead node first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar
from urllib.parse import urlsplit

from sasflow.errors import ConfigurationError
from sasflow.redact import redact_url
from sasflow.urllist import split_urls

T = TypeVar("T")

AMQP_SCHEMES = ("amqp", "amqps")
MEMORY_SCHEME = "memory"
ACCEPTED = "amqp://, amqps:// (RabbitMQ) or memory:// (the in-process bus)"


def scheme(url: str) -> str:
    """The URL's scheme in lower case ("" when it has none or is malformed)."""
    if "://" not in url:
        return ""
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return ""


def broker_urls(text: str) -> tuple[str, ...]:
    """The entries of a broker setting, each checked; ConfigurationError naming the first bad
    one (its password hidden). `memory://` is only valid alone."""
    entries = split_urls(text)
    for index, entry in enumerate(entries, start=1):
        where = entry_name(entry, index, len(entries))
        if not entry:
            raise ConfigurationError(
                f"{where} is empty: give an {ACCEPTED} URL, or remove the extra comma"
            )
        kind = scheme(entry)
        if kind == MEMORY_SCHEME and len(entries) > 1:
            raise ConfigurationError(
                f"{where} is the in-process bus, which cannot be one of several brokers"
            )
        if kind not in (*AMQP_SCHEMES, MEMORY_SCHEME):
            raise ConfigurationError(f"unsupported {where}: the scheme must be {ACCEPTED}")
        after_password = entry.partition("://")[2].rpartition("@")[2]
        stray = next((c for c in after_password if c == "," or c.isspace()), None)
        if stray is not None:
            raise ConfigurationError(
                f"{where} holds {'a comma' if stray == ',' else 'whitespace'} in its host, "
                "virtual host or options: give each broker a whole URL "
                "(amqp://h1/,amqp://h2/), and write a comma or space inside one as %2C or %20"
            )
    return tuple(entries)


def entry_name(entry: str, index: int, count: int) -> str:
    """How an error names the entry `index` (from 1) of `count`, its password hidden."""
    shown = repr(redact_url(entry))
    return f"broker URL {shown}" if count == 1 else f"broker URL {index} of {count} ({shown})"


def connect_order(brokers: Sequence[T], rng: random.Random) -> list[T]:
    """`brokers` in a new random order (a copy): the order one connect tries them in."""
    return rng.sample(list(brokers), len(brokers))
