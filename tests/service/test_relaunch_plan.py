"""The next smaller plan of ``autobatch run``: the largest micro-batch below that keeps the global batch."""

from __future__ import annotations

import pytest

from autobatch.records.result import Chosen, TuneResult
from autobatch.service.relaunch import job_spec, smaller


def _plan(micro: int, accum: int, world: int = 1, own: int | None = None) -> Chosen:
    return Chosen(
        "script", "script", False, micro, accum, world, micro * accum * world, script_accumulation=own
    )


@pytest.mark.parametrize(
    ("micro", "accum", "world", "own", "expected"),
    [
        (8, 1, 1, None, (4, 2)),  # half, twice the accumulation
        (4, 2, 1, None, (2, 4)),
        (6, 1, 1, None, (3, 2)),
        (7, 1, 1, None, (1, 7)),  # a prime: only 1 keeps 7 exactly
        (12, 2, 2, None, (8, 3)),  # 48 on 2 ranks
        (8, 2, 1, 2, (4, 4)),  # the script's own accumulation of 2 kept
        (1, 8, 1, None, None),
    ],
)
def test_smaller_keeps_the_global_batch(micro, accum, world, own, expected) -> None:
    got = smaller(_plan(micro, accum, world, own))
    assert got == expected
    if got is not None:
        assert got[0] * got[1] * world == micro * accum * world


def test_the_job_gets_the_plans_batch_and_length_as_a_probe_got_them() -> None:
    chosen = Chosen("script", "script", False, 12, 1, 1, 12, seq_len=1024)
    result = TuneResult("train.py", ["--config", "c.yaml"], {"type": "cpu"}, "throughput", [], chosen=chosen,
                        as_is={"batch_env": "BS", "seq_len_env": "SEQ_LEN"})  # fmt: skip
    spec = job_spec(result, (), None)
    assert {name: spec.env[name] for name in ("BS", "SEQ_LEN", "AUTOBATCH_BATCH_SIZE", "AUTOBATCH_SEQ_LENGTH")} == {
        "BS": "12", "SEQ_LEN": "1024", "AUTOBATCH_BATCH_SIZE": "12", "AUTOBATCH_SEQ_LENGTH": "1024"
    }  # fmt: skip
    assert spec.argv[-3:] == ["train.py", "--config", "c.yaml"]


#: torchrun's stderr when rank 1 ran out of memory and rank 0 then lost its peer (abridged from a real run).
TORCHRUN = """[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 57, in <module>
[rank1]:     loss.backward()
[rank1]: RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 67108864 bytes. Error code 12 (Cannot allocate memory)
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 57, in <module>
[rank0]:     loss.backward()
[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:62681. This is typically caused by a remote worker crashing.
Traceback (most recent call last):
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3464)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 3465)
============================================================
"""


def test_under_torchrun_the_root_cause_ranks_traceback_decides() -> None:
    from autobatch.supervise.job import _oom_reason, root_cause

    cause = root_cause(TORCHRUN)
    assert cause is not None and cause.startswith("Traceback") and "Connection closed" not in cause
    reason = _oom_reason(1, TORCHRUN, None, None, None)
    assert reason is not None and "DefaultCPUAllocator" in reason
    rank0 = TORCHRUN.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    # torchrun saw rank 0 exit first, but its error is its peer's failure: rank 1's out-of-memory error decides
    # (a loaded CI run named rank 0, aborted on its closed connection, and the job was not relaunched)
    reason = _oom_reason(1, rank0, None, None, None)
    assert reason is not None and "DefaultCPUAllocator" in reason
    own = rank0.replace("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:62681. This is "
                        "typically caused by a remote worker crashing.", "ValueError: bad config")  # fmt: skip
    assert _oom_reason(1, own, None, None, None) is None  # rank 0's own error is not memory
    assert root_cause("Traceback (most recent call last):\nValueError: x\n") is None


#: A guarded job's stderr when BatchNorm refused the guard's micro-batch of one sample (abridged from a real run).
GUARD_REFUSED = """Traceback (most recent call last):
  File "/work/autobatch/guard/guard.py", line 389, in _run
    loss = loss_fn(model, part)
           ^^^^^^^^^^^^^^^^^^^^
  File "/work/lib/torch/nn/functional.py", line 2854, in _verify_batch_size
    raise ValueError(
ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 32])

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train.py", line 58, in <module>
    guard.step(model, optimizer, (ids, labels), loss_fn)
autobatch.errors.GuardError: batch 3 (4 samples, shapes [[4, 300000], [4]]) ran a micro-batch of 1 sample, which \
the model refuses in training (Expected more than 1 value per channel when training, ...): the guard had lowered \
the micro-batch to 1, as 2 samples ran out of memory
hint: BatchNorm cannot normalise one sample: replace BatchNorm with a norm of each sample alone (GroupNorm, LayerNorm)
"""


def test_a_job_ended_by_its_guards_error_is_read_from_its_last_traceback() -> None:
    """The guard's error is the job's end when it is the last exception of the last traceback: raised from
    BatchNorm's ValueError (no out-of-memory failure named), or on the rank torchrun names; not one the job
    logged and went on from, nor a ValueError alone."""
    from autobatch.supervise.job import _oom_reason, guard_error, root_cause

    found = guard_error(GUARD_REFUSED)
    assert found is not None and found.message.startswith(
        "batch 3 (4 samples, shapes [[4, 300000], [4]]) ran a"
    )
    assert found.hint.startswith("BatchNorm cannot normalise one sample: replace BatchNorm")
    assert (
        _oom_reason(1, GUARD_REFUSED, None, None, None) is None
    )  # not an out-of-memory end: run read exit 1
    ranked = "".join(f"[rank1]: {line}\n" for line in GUARD_REFUSED.splitlines())
    torchrun = (
        ranked + TORCHRUN[TORCHRUN.index("Traceback (most recent call last):\n    raise ChildFailedError") :]
    )
    assert guard_error(root_cause(torchrun) or "") == found  # torchrun's own traceback comes last
    logged = (
        GUARD_REFUSED
        + "step 4\nTraceback (most recent call last):\n  File \"train.py\"\nKeyError: 'labels'\n"
    )
    assert guard_error(logged) is None
    assert guard_error(GUARD_REFUSED.split("The above")[0]) is None
    assert guard_error("autobatch.errors.GuardError: printed, not raised\n") is None
