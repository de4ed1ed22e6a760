"""The guard in training loops as people write them, each run as a script in a subprocess against the same loop
without the guard (tests/scripts/guard/); out-of-memory failures injected with the documented test hook
(``AUTOBATCH_GUARD_FAIL_AT``), which asks the allocator for a petabyte: a real failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, SCRIPTS, terminate_at

pytestmark = pytest.mark.slow

GUARD_SCRIPTS = SCRIPTS / "guard"


def run_script(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a script of tests/scripts/guard/ in ``tmp``; its output (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, str(GUARD_SCRIPTS / name), *args],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def run_failing(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a script of tests/scripts/guard/ in ``tmp`` that must end with an error (exit 1); its stderr."""
    proc = subprocess.run(
        [sys.executable, str(GUARD_SCRIPTS / name), *args],
        cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stderr


def max_relative_difference(a: Path, b: Path) -> float:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max() / right[k].abs().max().clamp_min(1e-12)) for k in left)


def matches_the_loop_without_the_guard(tmp: Path, name: str, *args: str, fail_at: str = "1") -> str:
    """Run the script's loop (with ``args``) without the guard (``--out reference.pt``), then under it (``--guard
    --out guarded.pt``) with the batches ``fail_at`` running out of memory; the two must end with the same
    parameters (relative difference <= 1e-9: every sample ran once, weighted as in the whole batch). The guarded
    run's output."""
    run_script(tmp, name, *args, "--out", "reference.pt")
    out = run_script(
        tmp, name, *args, "--guard", "--out", "guarded.pt", env={"AUTOBATCH_GUARD_FAIL_AT": fail_at}
    )
    assert max_relative_difference(tmp / "guarded.pt", tmp / "reference.pt") <= 1e-9
    return out


def test_a_micro_batch_without_tokens_adds_nothing_to_a_token_mean(tmp_path: Path) -> None:
    """Lowered from 8 to 2 at batch 1, the last micro-batch of each batch holds only samples whose labels are
    all -100: its token mean is 0/0. It counts for nothing (weight 0), and must not turn the step into NaN."""
    run_script(tmp_path, "sft_masked.py", "--out", "reference.pt", "--losses", "reference.jsonl")
    out = run_script(
        tmp_path, "sft_masked.py", "--guard", "--out", "guarded.pt", "--losses", "guarded.jsonl",
        env={"AUTOBATCH_GUARD_FAIL_AT": "1"},
    )  # fmt: skip
    assert "micro-batch lowered 8 -> 2" in out
    guarded = [json.loads(line)["loss"] for line in (tmp_path / "guarded.jsonl").read_text().splitlines()]
    reference = [json.loads(line)["loss"] for line in (tmp_path / "reference.jsonl").read_text().splitlines()]
    assert guarded == pytest.approx(reference, rel=1e-9)
    assert max_relative_difference(tmp_path / "guarded.pt", tmp_path / "reference.pt") <= 1e-9


def test_the_lists_a_collate_leaves_one_item_a_sample_are_split_with_the_tensors(tmp_path: Path) -> None:
    """The default collate leaves strings (the samples' source names, their files) as lists of one item per
    sample: a micro-batch takes its own samples' items, as it takes their rows."""
    out = matches_the_loop_without_the_guard(tmp_path, "tagged_samples.py")
    assert "micro-batch lowered 16 -> 8" in out


def test_a_preempted_run_keeps_its_out_of_memory_evidence(tmp_path: Path) -> None:
    """SIGTERM ends a Python job without running its ``with`` blocks' exits (a scheduler's preemption, and how
    ``autobatch run`` forwards one): the lowering at batch 3 is in the key's evidence all the same."""
    import signal

    from autobatch.cache import CacheFolder, EvidenceStore

    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, str(GUARD_SCRIPTS / "preemptible_job.py"), "--key", "k1"],
        cwd=tmp_path, env={**env, "AUTOBATCH_GUARD_FAIL_AT": "3"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = terminate_at(proc, "step 5")
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert "step 3: micro-batch lowered 8 -> 4" in err
    events = EvidenceStore(CacheFolder(str(tmp_path / "cache"))).read("k1")
    assert [(e.kind, e.step, e.micro_batch_size, e.new_micro_batch_size, e.reason) for e in events] == [
        ("change", 3, 8, 4, "out of memory")
    ]
    assert events[0].shapes == [[16, 32], [16, 1]]


def batches(out: str) -> list[dict[str, int]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"')]


def test_a_run_resumed_from_its_checkpoint_goes_on_where_the_guard_stood(tmp_path: Path) -> None:
    """Lowered at batch 1, checkpointed after batch 5, preempted after batch 6: the resumed run goes on at the
    lowered micro-batch and numbers its batches after the checkpoint's (the test hook's batch 8 is the loop's 8),
    batch by batch as the run that was never stopped."""
    hook = {"AUTOBATCH_GUARD_FAIL_AT": "1,8"}
    whole = batches(run_script(tmp_path, "resumable_loop.py", "--checkpoint", "whole.pt", env=hook))
    first = batches(run_script(tmp_path, "resumable_loop.py", "--stop-after", "6", env=hook))
    second = batches(run_script(tmp_path, "resumable_loop.py", "--resume", env=hook))
    assert [b["micro"] for b in first] == [16] + [8] * 6
    assert [(b["step"], b["guard_step"]) for b in second] == [(s, s) for s in range(6, 12)]
    assert second == whole[6:]  # at 8, then lowered to 4 at batch 8 (lowered again at batch 8)
    assert [b["micro"] for b in second] == [8, 8, 4, 4, 4, 4] and second[2]["attempts"] == 2


def test_lightning_resumed_from_its_checkpoint_goes_on_where_the_guard_stood(tmp_path: Path) -> None:
    """``Guarded`` keeps the guard's state in Lightning's checkpoints: lowered at batch 1 and checkpointed after
    batch 2, the run resumed with ``ckpt_path="last"`` goes on at the lowered micro-batch from batch 3."""
    pytest.importorskip("lightning")
    first = batches(
        run_script(tmp_path, "lightning_resume.py", "--max-steps", "4", env={"AUTOBATCH_GUARD_FAIL_AT": "1"})
    )
    assert [(b["guard_step"], b["micro"]) for b in first] == [(0, 8), (1, 4), (2, 4), (3, 4)]
    second = batches(run_script(tmp_path, "lightning_resume.py", "--resume"))
    assert [(b["global_step"], b["guard_step"], b["micro"]) for b in second] == [
        (s, s, 4) for s in range(3, 8)
    ]


def test_a_batch_run_again_draws_the_same_dropout_and_keeps_batchnorm_statistics_once(tmp_path: Path) -> None:
    """Batch 2 runs out in its second micro-batch, after the first drew its dropout masks and moved BatchNorm's
    running statistics. Run again at 4, it is the batch a run lowered before touching it ran (the test hook
    fails before the first forward): the same masks, the statistics moved once."""
    out = run_script(tmp_path, "dropout_batchnorm.py", "--heavy-step", "2", "--out", "mid.pt")
    assert "step 2: micro-batch lowered 8 -> 4" in out
    run_script(tmp_path, "dropout_batchnorm.py", "--out", "before.pt", env={"AUTOBATCH_GUARD_FAIL_AT": "2"})
    import torch

    mid, before = torch.load(tmp_path / "mid.pt"), torch.load(tmp_path / "before.pt")
    assert int(mid["1.num_batches_tracked"]) == int(before["1.num_batches_tracked"]) == 2 * 2 + 4 * 4
    assert all(torch.equal(mid[k], before[k]) for k in before), [
        k for k in before if not torch.equal(mid[k], before[k])
    ]


def test_a_failure_in_the_second_batch_of_a_step_keeps_the_first_batch_gradients(tmp_path: Path) -> None:
    """Two batches through ``guard.backward`` before one optimizer step: the second runs out of memory at once,
    and its run again adds to the first batch's gradients, which the failure left alone."""
    out = matches_the_loop_without_the_guard(tmp_path, "two_sources.py")
    assert "step 1: micro-batch lowered 16 -> 8" in out


def test_a_step_of_two_optimizers_over_one_models_groups_matches_the_loop_without_the_guard(
    tmp_path: Path,
) -> None:
    """``guard.step(model, [adamw, sgd], ...)``: each optimizer steps once per batch and its gradients are the
    whole batch's, lowered 16 -> 8 at batch 1 as without a failure. Before, a list failed after the backward had
    run (``'list' object has no attribute 'step'``)."""
    out = matches_the_loop_without_the_guard(tmp_path, "two_optimizers.py")
    assert "micro-batch lowered 16 -> 8" in out and "step 3: micro-batch 8" in out


def test_a_batchnorm_model_gets_no_lone_sample_from_the_split(tmp_path: Path) -> None:
    """100 samples in batches of 12 leave a last batch of 4. Lowered to micro-batch 3 at batch 0, the guard splits
    it 2 + 2; it split it 3 + 1, and BatchNorm1d refused the lone sample with its own ValueError."""
    out = run_script(tmp_path, "batchnorm_tail.py", env={"AUTOBATCH_GUARD_FAIL_AT": "0"})
    assert "step 0: micro-batch lowered 6 -> 3" in out
    assert "step 7: 12 samples, micro-batch 3 x 4" in out and "step 8: 4 samples, micro-batch 3 x 2" in out


@pytest.mark.parametrize(
    ("args", "fail_at", "why", "fix"),
    [
        (("--micro-batch", "2", "--sizes", "2"), "0", "the guard had lowered the micro-batch to 1",
         "replace BatchNorm with a norm of each sample alone (GroupNorm, LayerNorm)"),
        (("--samples", "97"), "", "the batch itself is one sample", "DataLoader(..., drop_last=True)"),
    ],
)  # fmt: skip
def test_a_batchnorm_model_at_one_sample_ends_in_a_guard_error_that_names_the_fix(
    tmp_path: Path, args: tuple[str, ...], fail_at: str, why: str, fix: str
) -> None:
    """Where a micro-batch of 1 cannot be helped (lowered to 1; a last batch of 1 sample), BatchNorm's refusal
    becomes a GuardError saying why the batch had one sample and what to change, hint in its text."""
    err = " ".join(
        run_failing(tmp_path, "batchnorm_tail.py", *args, env={"AUTOBATCH_GUARD_FAIL_AT": fail_at}).split()
    )
    assert "autobatch.errors.GuardError: batch" in err and "ran a micro-batch of 1 sample" in err
    assert why in err and "hint: BatchNorm cannot normalise one sample: " in err and fix in err


def test_the_summary_counts_the_failures_the_guard_handled_and_the_error_shows_its_hint(
    tmp_path: Path,
) -> None:
    """Batch 2 holds a sample that does not fit alone: 4 -> 2 and 2 -> 1 are handled, the failure at 1 ends the run
    (GuardError, its hint in the traceback). The summary counts 2 failures; it counted the last one too."""
    err = " ".join(run_failing(tmp_path, "too_long.py").split())
    assert "GuardError: batch 2 (8 samples" in err
    assert "hint: shorten or bucket its longest samples" in err
    summary = json.loads((tmp_path / "guard-events.jsonl").read_text().splitlines()[-1])
    assert summary["event"] == "summary" and summary["final"]
    assert (summary["steps"], summary["out_of_memory"], summary["micro_batch_size"]) == (2, 2, 1)


def test_the_guards_usage_error_shows_its_hint_in_the_scripts_traceback(tmp_path: Path) -> None:
    """A job started before its tune wrote the result: the guard's UsageError ends the script, and its traceback
    shows the hint, what to do (it showed the message alone; GuardError alone carried its hint)."""
    err = run_failing(tmp_path, "guarded_job.py", "--result", "missing.json")
    *_, error, hint = err.rstrip().splitlines()
    assert error == "autobatch.errors.UsageError: no result file at missing.json", err
    assert hint == "hint: run `autobatch tune` first, or pass the path it wrote", err


def test_a_batch_of_the_samples_own_token_tensors_is_counted_by_its_samples(tmp_path: Path) -> None:
    """A collate that keeps each sample's tokens as a tensor of its own length, first in the batch's dict: the
    batch is its 16 samples (it read 40, the first sample's tokens, and ran the whole batch as every one of its
    5 "micro-batches"), split 8 + 8 after the lowering, and trains as the loop without the guard."""
    out = matches_the_loop_without_the_guard(tmp_path, "token_lists.py")
    assert "step 0: 16 samples, micro-batch 16 x 1" in out and "step 1: 16 samples, micro-batch 8 x 2" in out


def test_a_batch_that_is_the_list_of_its_samples_token_tensors_counts_its_samples(tmp_path: Path) -> None:
    """A collate that returns the samples' token tensors alone, as a list (the whole batch): 16 tensors of their own
    lengths are 16 samples, split 8 + 8 after the lowering. It was read by its tensors' rows, and refused as parts
    that disagree unless one sample happened to hold 16 tokens."""
    out = matches_the_loop_without_the_guard(tmp_path, "token_lists.py", "--bare")
    assert "step 0: 16 samples, micro-batch 16 x 1" in out and "step 1: 16 samples, micro-batch 8 x 2" in out
    assert "step 3: 16 samples, micro-batch 8 x 2" in out


def test_a_list_of_the_samples_token_tensors_is_split_by_sample_when_each_has_as_many_tokens_as_samples(
    tmp_path: Path,
) -> None:
    """Documents cut to 16 tokens in batches of 16, kept by the collate as a list of one tensor a sample: where
    every document of a batch reaches the maximum (batches 1 and 3), the list holds 16 tensors of 16 rows, and it
    was read as 16 batched tensors: each micro-batch took half of every document's tokens beside half the labels
    (cross_entropy: 16 inputs against 8 targets). It is split by sample, as batch 2's list of mixed lengths is."""
    out = matches_the_loop_without_the_guard(tmp_path, "truncated_tokens.py")
    assert "step 1: micro-batch lowered 16 -> 8" in out
    assert (
        "step 1: 16 samples, 16 cut, micro-batch 8 x 2" in out
        and "step 3: 16 samples, 16 cut, micro-batch 8 x 2" in out
    )
    assert "step 2: 16 samples, 13 cut, micro-batch 8 x 2" in out


def test_a_label_per_token_flattened_over_the_batch_is_refused_naming_both(tmp_path: Path) -> None:
    err = " ".join(run_failing(tmp_path, "token_lists.py", "--guard", "--flat-labels").split())
    assert "UsageError: the batch's parts disagree on their number of samples" in err
    assert "batch['labels'] 322 against batch['tokens'] (16 items of 40, 23, 18, 28, ...)" in err


def test_a_preempted_run_keeps_its_summary_so_far(tmp_path: Path) -> None:
    """SIGTERM skips ``with guard:``'s exit, which wrote the summary line: the events file ended at the change
    lines. The summary so far is the file's last line, rewritten at each change and once a second."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, str(GUARD_SCRIPTS / "preemptible_job.py"), "--events", "events.jsonl"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_GUARD_FAIL_AT": "3"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = terminate_at(proc, "step 150")  # 2.4 s after the last change (grown back at 27) at least
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    *changes, summary = lines
    assert [(c["step"], c["reason"]) for c in changes][:1] == [(3, "out of memory")]  # then grows back
    assert {c["event"] for c in changes} == {"micro-batch"} and summary["event"] == "summary"
    # updated once a second, not only at the changes: batches after the last change are counted
    assert not summary["final"] and changes[-1]["step"] + 1 < summary["steps"] <= 151
    assert (summary["out_of_memory"], summary["smallest_micro_batch_size"]) == (1, 4)
    assert summary["micro_batch_size"] == changes[-1]["new"] and summary["peak_bytes"]


def test_a_hugging_face_trainer_resumed_from_its_checkpoint_goes_on_where_the_guard_stood(
    tmp_path: Path,
) -> None:
    """``GuardedTrainer`` keeps the guard's state in the Trainer's checkpoints: lowered at batch 1 and
    checkpointed after batch 4, the run resumed with ``resume_from_checkpoint=True`` goes on at micro-batch 4,
    numbering its batches from 4 (it started the guard afresh: micro-batch 8, batch 0)."""
    pytest.importorskip("transformers")
    first = batches(
        run_script(tmp_path, "hf_resume.py", "--max-steps", "4", env={"AUTOBATCH_GUARD_FAIL_AT": "1"})
    )
    assert [(b["global_step"], b["guard_step"], b["micro"]) for b in first] == [
        (1, 0, 8),
        (2, 1, 4),
        (3, 2, 4),
        (4, 3, 4),
    ]
    second = batches(run_script(tmp_path, "hf_resume.py", "--resume"))
    assert [(b["global_step"], b["guard_step"], b["micro"]) for b in second] == [
        (s + 1, s, 4) for s in range(4, 8)
    ]
