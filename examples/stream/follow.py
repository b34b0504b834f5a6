"""Follow run updates with the Python SDK, resuming the same subscriber after a restart.

SASFLOW_API_URL=http://127.0.0.1:8080 SASFLOW_API_TOKEN=... python -m examples.stream.follow
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from sasflow.client import Client, StreamFilter, StreamUpdate

SUBSCRIBER_FILE = Path(os.environ.get("SUBSCRIBER_FILE", ".sasflow-subscriber"))


def on_update(update: StreamUpdate) -> None:
    # Acknowledged when this returns; raise to have it sent again later.
    where = f" step {update.step}" if update.step else ""
    print(f"run {update.run}{where}: {update.previous} -> {update.state}", flush=True)


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    known = SUBSCRIBER_FILE.read_text().strip() if SUBSCRIBER_FILE.exists() else None
    url = os.environ.get("SASFLOW_API_URL", "http://127.0.0.1:8080")
    with Client(url, os.environ["SASFLOW_API_TOKEN"]) as api:
        subscription = api.subscription(
            StreamFilter(workflows=tuple(sys.argv[1:]) or None),
            on_update,
            name="example",
            subscriber_id=known,
            stop=stop,
        )
        thread = threading.Thread(target=subscription.run, name="stream")
        thread.start()
        try:
            while thread.is_alive():
                if subscription.subscriber_id and subscription.subscriber_id != known:
                    known = subscription.subscriber_id
                    SUBSCRIBER_FILE.write_text(known)  # a restart resumes this subscriber
                thread.join(0.5)
        except KeyboardInterrupt:
            stop.set()
            thread.join()


if __name__ == "__main__":
    main()
