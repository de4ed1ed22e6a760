"""Run the real ``autobatch`` command in this process with a fake probe runner (no torch, no server).

``python tests/fake_cli.py LOG -- ARGS...`` runs ``autobatch ARGS...`` with the CLI's sessions wired to
a :class:`autobatch.testing.FakeRunner` over an affine curve whose probes take ``FAKE_PROBE_SECONDS``
(default 0.05) of wall time each; every probe appends ``{"pid", "start", "end", "batch"}`` to LOG. Tests
start two of these at once to see whether their probes overlap in time, which in-process tests cannot.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autobatch.cli import main  # noqa: E402
from autobatch.cli.state import STATE  # noqa: E402
from autobatch.records.protocol import ProbeOutcome, ProbeRequest  # noqa: E402
from autobatch.testing import FakeRunner, affine  # noqa: E402

MiB = 1 << 20
CURVE = affine(400 * MiB, 1.7 * MiB)


class LoggingRunner(FakeRunner):
    """A FakeRunner whose probes take time and are logged with their start and end."""

    log: str = ""

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        start = time.time()
        if request.op == "probe":
            time.sleep(float(os.environ.get("FAKE_PROBE_SECONDS", "0.05")))
        outcome = super().run(request)
        with open(self.log, "a") as handle:
            handle.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "start": start,
                        "end": time.time(),
                        "batch": request.batch_size,
                        "op": request.op,
                    }
                )
                + "\n"
            )
        return outcome


def run(log: str, args: list[str]) -> None:
    runner = LoggingRunner(CURVE)
    runner.log = log
    STATE.runner_factory = lambda: runner
    sys.argv = ["autobatch", *args]
    main()


if __name__ == "__main__":
    split = sys.argv.index("--")
    run(sys.argv[1], sys.argv[split + 1 :])
