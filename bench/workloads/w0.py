"""W0: the limits of this machine, measured in the same run as the yardsticks of every ratio."""

from __future__ import annotations

from bench import limits
from bench.common import Sizes, scratch
from bench.report import Results, report, say
from bench.roundtrip import roundtrips

RR1 = "W0 rabbitmq rr 1 in flight"
RR1_P50 = "W0 rabbitmq rr 1 p50"
RR8 = "W0 rabbitmq rr 8 in flight"


def run_w0(sizes: Sizes, results: Results) -> None:
    say("W0 limits (this machine, same run)", results)
    seconds = sizes.w0_seconds
    with scratch("w0", []) as (_url, engine, names):
        report(
            results,
            "W0 update tx/s",
            [limits.update_rate(engine, seconds) for _ in range(sizes.repeat)],
            "tx/s",
        )
        for claimers in (1, 2, 4):
            for batch in (1, 50):
                report(
                    results,
                    f"W0 claim {claimers} thr x batch {batch}",
                    [
                        limits.claim_rate(engine, claimers, batch, seconds)
                        for _ in range(sizes.repeat)
                    ],
                    "claims/s",
                )
        say(
            "  request/reply: durable queues, persistent messages, confirms pipelined on both "
            "sides, request acked after its reply's confirm (bench/roundtrip.py)",
            results,
        )
        for in_flight in (1, 8):
            measured = [
                roundtrips(names.namespace, in_flight, seconds) for _ in range(sizes.repeat)
            ]
            name = f"W0 rabbitmq rr {in_flight} in flight"
            report(results, name, [m.rate for m in measured], "rt/s")
            report(
                results,
                f"W0 rabbitmq rr {in_flight} p50",
                [m.p50_ms for m in measured],
                "ms",
                fmt=".2f",
            )
