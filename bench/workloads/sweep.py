"""Sweep: the supervisor's sweep of 1,000 expired steps among many finished step rows."""

from __future__ import annotations

from bench.common import Sizes
from bench.report import Results, report, say, verdict
from bench.sweep import measure


def run_sweep(sizes: Sizes, results: Results) -> None:
    tables = ", ".join(f"{r:,}" for r in sizes.sweep_rows)
    say(
        f"Sweep: supervisor sweep of 1,000 expired steps ({tables} step rows), "
        "bench/sweep.py's measure()",
        results,
    )
    for rows in sizes.sweep_rows:
        timings = [t * 1000 for t in measure(rows, 1000, sizes.repeat)]
        results.figures[f"sweep {rows:,} rows"] = timings
    big, small = results.median("sweep 1,000,000 rows"), results.median("sweep 100,000 rows")
    for rows in sizes.sweep_rows:
        name = f"sweep {rows:,} rows"
        extra = ""
        if rows == 1_000_000 and big is not None:
            extra = f"target <= 100 ms: {verdict(big <= 100)}"
            if small:
                extra += (
                    f"; {big / small:.2f}x the 100k figure, target <= 2x: "
                    f"{verdict(big <= 2 * small)}"
                )
        report(results, name, results.figures[name], "ms", extra)
