"""What the handler conveniences cost one attempt, in-process (no broker, no database):

    python bench/handlers.py [--calls N]

- an `async def` handler through the agent's event loop against the same plain function called
  directly (the hand-over to the loop thread and back);
- the traceback kept for a failure (from the handler's frame, bounded, redacted);
- the classification of an exception as transient (by class name along the MRO), for an httpx
  error and for a plain exception.
Prints microseconds per call; there is no target: the figures are to compare with a step's
round trip (milliseconds, bench/latency.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from sasflow.agents import Agent, Call
from sasflow.agents.aio import HandlerLoop
from sasflow.agents.tracebacks import handler_traceback


def _call() -> Call:
    return Call(
        input={},
        idempotency_key="k",
        attempt=1,
        deadline=time.monotonic() + 3600,
        step_id=1,
        run_id=1,
        workflow="wf",
        step="s",
        action="a",
        kind="forward",
    )


def _per_call(calls: int, action: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - start) / calls * 1e6


def _nested(depth: int) -> None:
    if depth == 0:
        raise ValueError("refused by postgresql://shop:secret@db/shop")
    _nested(depth - 1)


def _failing(call: Call) -> None:
    _nested(call.attempt + 9)


def _caught() -> BaseException:
    try:
        _failing(_call())
    except ValueError as exc:
        return exc
    raise AssertionError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    calls = parser.parse_args().calls

    def plain(call: Call) -> dict[str, int]:
        return {"n": call.attempt}

    async def coroutine(call: Call) -> dict[str, int]:
        return {"n": call.attempt}

    loop = HandlerLoop("bench")
    call = _call()
    try:
        direct = _per_call(calls, lambda: plain(call))
        on_loop = _per_call(calls, lambda: loop.run(coroutine(call), call))
    finally:
        loop.close()
    error = _caught()
    traceback = _per_call(calls, lambda: handler_traceback(error, _failing))
    agent = Agent("bench")
    refused = httpx.ConnectError("refused")
    plain_error = KeyError("x")
    http = _per_call(calls, lambda: agent.is_transient(refused))
    other = _per_call(calls, lambda: agent.is_transient(plain_error))
    print(f"calls per figure: {calls}")
    print(f"plain handler called directly      {direct:8.1f} us")
    print(f"async handler on the agent's loop  {on_loop:8.1f} us")
    print(f"traceback kept (12 frames)         {traceback:8.1f} us")
    print(f"is_transient(httpx.ConnectError)   {http:8.1f} us")
    print(f"is_transient(KeyError)             {other:8.1f} us")


if __name__ == "__main__":
    main()
