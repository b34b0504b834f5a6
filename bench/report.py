"""How the suite prints: the machine line, each figure as median (min-max) of its repeats,
ratios to the yardsticks of the same run and the issue's targets with PASS or FALL SHORT."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from sqlalchemy import text

from sasflow.store.db import make_engine
from tests import services


@dataclass
class Results:
    figures: dict[str, list[float]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = self.figures.get(name)
        return statistics.median(values) if values else None


def say(line: str, results: Results | None = None) -> None:
    print(line, flush=True)
    if results is not None:
        results.lines.append(line)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def report(
    results: Results,
    name: str,
    values: list[float],
    unit: str,
    extra: str = "",
    *,
    fmt: str = ".1f",
) -> None:
    results.figures[name] = values
    med = statistics.median(values)
    say(
        f"  {name:<34} {med:>10{fmt}} {unit:<8} (min {min(values):{fmt}}, max "
        f"{max(values):{fmt}}, n={len(values)}){'  ' + extra if extra else ''}",
        results,
    )


def ratio(value: float, base: float | None, label: str, target: float) -> str:
    """`= 45% of <label>; target >= 40%: PASS`, or why not when the base was not measured."""
    if not base:
        return f"(no {label.split(' (', maxsplit=1)[0]} in this run: no ratio)"
    share = value / base
    return f"= {share:.0%} of {label}; target >= {target:.0%}: {verdict(share >= target)}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _rabbitmq_version() -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return "unknown (no rabbitmqctl)"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(  # noqa: S603 - a fixed argv, rabbitmqctl found on PATH
            [ctl, "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    return "unknown"


def machine_line() -> str:
    admin = make_engine(services.admin_url())
    try:
        with admin.connect() as conn:
            pg = str(conn.execute(text("SHOW server_version")).scalar())
            settings = {
                name: str(conn.execute(text(f"SHOW {name}")).scalar())
                for name in ("fsync", "synchronous_commit", "autovacuum")
            }
    finally:
        admin.dispose()
    packages = ", ".join(f"{p} {metadata.version(p)}" for p in ("sqlalchemy", "psycopg", "pika"))
    return (
        f"machine: {os.cpu_count()} cores, {_cpu_model()}; PostgreSQL {pg} "
        f"(fsync={settings['fsync']}, synchronous_commit={settings['synchronous_commit']}, "
        f"autovacuum={settings['autovacuum']}); "
        f"RabbitMQ {_rabbitmq_version()}; Python {platform.python_version()}; {packages}"
    )


def load_line() -> str:
    """The machine's load averages: the figures of a shared machine are only as quiet as this."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min)"
