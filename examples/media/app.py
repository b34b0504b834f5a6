"""A media job: probe the upload, transcode it to three renditions in parallel, package them,
then publish. Run it with `SASFLOW_APP=examples.media.app` (from the repository root).

    probe ──┬── transcode-1080p ──┐
            ├── transcode-720p  ──┼── package ── publish
            └── transcode-audio ──┘

The three transcodes depend only on `probe`, so they are ready together and run at the same
time on the transcoder agent's worker threads (or processes); `package` waits for all three
(a fan-in). The work is simulated: each handler sleeps for its encoding time and reports
when it ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sasflow import Backoff, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

RENDITIONS: dict[str, dict[str, Any]] = {
    "1080p": {"kind": "video", "height": 1080, "kbps": 6000, "seconds": 0.6},
    "720p": {"kind": "video", "height": 720, "kbps": 3000, "seconds": 0.45},
    "audio": {"kind": "audio", "codec": "aac", "kbps": 128, "seconds": 0.3},
}
POLICY = StepPolicy(timeout=10, max_failures=3, backoff=Backoff(initial=0.5, maximum=5))

analyzer = Agent("analyzer")
transcoder = Agent("transcoder")
publisher = Agent("publisher")


def _work(call: Call, seconds: float) -> dict[str, Any]:
    """Simulated work that stops early when the agent shuts down or the deadline passes."""
    started = time.time()
    call.cancelled.wait(min(seconds, call.remaining()))
    return {"started": started, "finished": time.time(), "worker": threading.current_thread().name}


@analyzer.handler("probe")
def probe(call: Call) -> dict[str, Any]:
    source = call.input["source"]
    if not source.endswith((".mov", ".mp4", ".mkv")):
        raise PermanentError(f"not a video file: {source}")
    return {
        "source": source,
        "duration_s": call.input.get("duration_s", 60),
        "fps": 25,
        **_work(call, 0.05),
    }


@transcoder.handler("transcode")
def transcode(call: Call) -> dict[str, Any]:
    rendition = call.input["rendition"]
    spec = RENDITIONS[rendition]
    target = f"{call.input['source'].rsplit('.', 1)[0]}-{rendition}.mp4"
    return {"rendition": rendition, "file": target, **spec, **_work(call, spec["seconds"])}


@publisher.handler("package")
def package(call: Call) -> dict[str, Any]:
    files = [r["file"] for r in call.input["renditions"]]
    return {"manifest": f"{call.input['job']}/master.m3u8", "files": files, **_work(call, 0.05)}


@publisher.handler("publish")
def publish(call: Call) -> dict[str, Any]:
    return {"url": f"https://cdn.example.com/{call.input['manifest']}", **_work(call, 0.05)}


def _transcode_input(rendition: str) -> Callable[[StepContext], dict[str, Any]]:
    def build(ctx: StepContext) -> dict[str, Any]:
        return {"source": ctx.outputs["probe"]["source"], "rendition": rendition}

    return build


def _package_input(ctx: StepContext) -> dict[str, Any]:
    return {
        "job": ctx.business_key,
        "renditions": [ctx.outputs[f"transcode-{r}"] for r in RENDITIONS],
    }


def _publish_input(ctx: StepContext) -> dict[str, Any]:
    return {"manifest": ctx.outputs["package"]["manifest"]}


media = Workflow(
    "media",
    [
        Step("probe", "analyzer", "probe", policy=POLICY),
        *(
            Step(
                f"transcode-{r}",
                "transcoder",
                "transcode",
                after=("probe",),
                input=_transcode_input(r),
                policy=POLICY,
            )
            for r in RENDITIONS
        ),
        Step(
            "package",
            "publisher",
            "package",
            after=tuple(f"transcode-{r}" for r in RENDITIONS),
            input=_package_input,
            policy=POLICY,
        ),
        Step("publish", "publisher", "publish", input=_publish_input, policy=POLICY),
    ],
    version=1,
    output=lambda ctx: ctx.outputs["publish"],
)

registry = Registry(workflows=[media], agents=[analyzer, transcoder, publisher])
