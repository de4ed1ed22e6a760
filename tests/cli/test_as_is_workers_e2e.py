"""A plain loop whose DataLoader has two worker processes, forked (Linux's default) or spawned, run as it is on
the CPU device: the real command on tests/scripts/as_is/loader_workers.py (the data set prepared at import,
shuffled batches of one shape).

The workers send each batch as shared memory, which the cap (``RLIMIT_DATA``) does not count and the peak must
not either. Read from the address space's high-water mark against a later step's mappings, one to three batches
at a time counted as data: peaks that fell from step to step, a step that raised the peak by a batch's size (the
tune's "the peak depends on the data"), and a maximum 9-12 % under the job's (docs/as-is.md, "Processes the
script starts").
"""

from __future__ import annotations

import json

import pytest
from support import SCRIPTS, run_cli

from autobatch.core.step_peaks import SETTLED_STEP

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "as_is" / "loader_workers.py"
#: Ten steps of each stay in the first epoch (32,768 samples), whose workers the probe starts once; a batch of 3,200
#: is 3.15 MiB of shared memory (256 floats and a label a sample), a step's optimizer state 2.1 MiB of data.
BATCHES = (3200, 3000, 2800)


def _batch_bytes(batch: int) -> int:
    return batch * (256 * 4 + 8)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_loop_s_peak_counts_no_batch_its_workers_sent(start: str) -> None:
    spawn = ("--spawn",) if start == "spawn" else ()
    sizes = [arg for batch in BATCHES for arg in ("-b", str(batch))]
    proc = run_cli(
        "check", str(SCRIPT), *sizes, "--steps", "10", "--device", "cpu", "--memory", "512MiB", "--json", "--",
        "--batch-size", "{batch}", *spawn,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for report in json.loads(proc.stdout):
        peaks = report["step_peaks"]
        shown = [round(p / 2**20, 2) for p in peaks]
        assert report["fits"] and len(peaks) == 10, report
        assert peaks == sorted(peaks), shown  # a high-water mark never falls
        # nor passes the cap that holds the process under it
        assert max(peaks) <= report["budget_bytes"], shown
        # from the third step on, a step of one shape peaks where the one before it did (the optimizer state of
        # the second may show a step late, 2.1 MiB): a rise by a batch's size is a batch counted as data
        rises = [after - before for before, after in zip(peaks[SETTLED_STEP - 1 :], peaks[SETTLED_STEP:])]
        assert max(rises) < _batch_bytes(report["batch_size"]), (report["batch_size"], shown)
    err = " ".join(proc.stderr.split())
    assert "process(es) of its own (DataLoader workers, ...), which held" in err, err
    assert "not counted in the probe's peak or budget" in err and "memory cgroup" in err, err


def test_the_independent_harness_reads_the_peak_as_the_product_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness (tests/harness/as_is_process.py: the script in the job's fresh process, no autobatch code) reads
    its peak as a probe's is read. Read once at the end, VmPeak less the mappings then counted the batches mapped
    when the mark rose and gone by the end as data: up to a batch (5.9 MiB at 6,000) above the product's figure,
    which counts the job's fresh process too and autobatch's own 1-2 MiB beside the script."""
    from harness.as_is_process import run_as_is_trial

    monkeypatch.delenv("AUTOBATCH_FRESH_BASELINE")  # counted as the job's fresh process, as the harness runs
    batch = 6000
    proc = run_cli(
        "check", str(SCRIPT), "-b", str(batch), "--steps", "10", "--device", "cpu", "--memory", "512MiB", "--json",
        "--", "--batch-size", "{batch}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # one batch: one report
    product = report["peak_bytes"]
    for _ in range(2):  # the batches mapped at once differ from run to run
        trial = run_as_is_trial(SCRIPT, ["--batch-size", str(batch)], report["budget_bytes"], steps=10)
        assert trial.kind == "fits" and trial.peak_estimate is not None, trial.detail
        off = (trial.peak_estimate - product) / 2**20
        assert -3 <= off <= 1, (
            f"harness {trial.peak_estimate / 2**20:.2f} MiB, product {product / 2**20:.2f} MiB"
        )
