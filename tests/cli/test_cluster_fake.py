"""Issue 13 through the real command with a fake probe runner: the cache, the device lock, output.

As in test_commands_fake.py, ``main()`` runs under Typer's CliRunner with the sessions wired to
:class:`autobatch.testing.FakeRunner` (no torch, no probe server); where two runs must be separate
processes, tests/fake_cli.py runs the same thing in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, run_main, wire_fake_runner

from autobatch.errors import EXIT_SCRIPT
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
BASE = affine(400 * MiB, 1.7 * MiB)
KEEP = ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    runner = wire_fake_runner(FakeRunner(BASE), tmp_path, monkeypatch, keep=KEEP, script="import model\n")
    (tmp_path / "model.py").write_text("WIDTH = 256\n")
    return runner


def tune(*extra: str) -> tuple[int, dict, str]:
    code, out, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "adamw",
        "--no-recompute", "--json", *extra,
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


def probes(runner: FakeRunner) -> list[ProbeRequest]:
    return [r for r in runner.requests if r.op == "probe"]


def test_a_second_identical_tune_is_served_without_any_probe(fake: FakeRunner) -> None:
    code, first, _ = tune()
    assert code == 0 and first["probes"] > 0 and not first["cache"]["served"]
    asked = len(fake.requests)
    code, again, err = tune()
    assert code == 0, err
    assert len(fake.requests) == asked, "not even the model inspection ran again"
    assert again["cache"]["served"] and again["probes"] == 0
    assert (
        again["chosen"] == first["chosen"]
        and again["combinations"][0]["max_batch_size"] == first["combinations"][0]["max_batch_size"]
    )
    assert "served from the cache" in err


@pytest.fixture
def affinity() -> Iterator[set[int]]:
    """This process's CPU affinity, restored after the test."""
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


@pytest.mark.parametrize(
    "change",
    ["script", "local module", "searched setting", "script argument", "plan", "cores", "thread pool"],
)
def test_editing_what_decides_memory_invalidates_the_stored_result(
    fake: FakeRunner, change: str, affinity: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the CPU a process starts a thread per core it may run on, each with memory of its own: bound to one of
    # two cores (taskset, a job's CPU binding) or told OMP_NUM_THREADS=1, examples/mlp.py's maximum under
    # 600 MiB was 161, against 134 on both, and the answer of one was served to the other.
    if change == "cores" and len(affinity) < 2:
        pytest.skip("one core: a process here cannot be bound to fewer")
    assert tune()[0] == 0
    asked = len(probes(fake))
    extra: tuple[str, ...] = ()
    if change == "cores":
        os.sched_setaffinity(0, {min(affinity)})
    elif change == "thread pool":
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    elif change == "script":
        Path("train.py").write_text("import model\nSEQ = 2048\n")
    elif change == "local module":
        Path("model.py").write_text("WIDTH = 512\n")
    elif change == "searched setting":
        extra = ("--max-batch-size", "300")
    elif change == "script argument":
        extra = ("--", "--seq-len", "2048")
    else:
        extra = ("--global-batch-size", "512")
    code, again, err = tune(*extra)
    assert code == 0, err
    assert not again.get("cache", {}).get("served"), f"a stored result served after changing the {change}"
    if change in ("script", "local module", "script argument", "cores", "thread pool"):
        # the probe journal is keyed by the same sources: every probe is measured again
        assert len(probes(fake)) >= 2 * asked


def test_refresh_measures_every_probe_again_and_replaces_the_stored_result(fake: FakeRunner) -> None:
    assert tune()[0] == 0
    asked = len(probes(fake))
    code, again, _ = tune("--refresh")
    assert code == 0 and not again.get("cache", {}).get("served") and again["probes"] == asked
    assert len(probes(fake)) == 2 * asked
    code, third, _ = tune()
    assert code == 0 and third["cache"]["served"]


def test_no_cache_keeps_nothing(fake: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    assert tune("--no-cache")[0] == 0
    assert not (tmp_path / "cache").exists()


def test_a_damaged_cache_is_moved_aside_with_a_warning_and_rebuilt(
    fake: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(cache))
    assert tune()[0] == 0
    for path in [*cache.glob("*.result.json"), *cache.glob("*.jsonl")]:
        path.write_bytes(b"\x00garbage\n{half a line\n" + path.read_bytes()[:100])
    code, again, err = tune()
    assert code == 0, err
    shown = re.findall(r"\d\d:\d\d:\d\d warning: the cache file \S+ is damaged", err)
    assert len(shown) == 2 and "moved aside" in err and "rebuilt" in err
    assert sum("is damaged" in note for note in again["notes"]) == 2
    assert again["probes"] > 0 and not again.get("cache", {}).get("served")
    assert len(list(cache.glob("*.corrupt-*"))) == 2
    assert tune()[1]["cache"]["served"]  # rebuilt


def test_an_unwritable_cache_folder_leaves_the_tune_working(
    fake: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    code, result, err = tune()
    assert code == 0, err
    assert result["chosen"] and "cannot be written" in err
    assert any("cannot be written" in note for note in result["notes"])


class Preempted(KeyboardInterrupt):
    """What the CLI's SIGTERM handler raises (autobatch.cli.Terminated)."""


@pytest.mark.parametrize("baseline_moves", [False, True], ids=["same-process", "other-baseline"])
def test_an_interrupted_tune_resumes_without_measuring_anything_twice(
    fake: FakeRunner, baseline_moves: bool
) -> None:
    """The re-run starts from every probe the journal holds, even when its own probe process holds other
    memory before building (a fresh process's baseline moves, and with it the path the search would take)."""
    real_probe = fake._probe
    budget = {"left": 2}

    def preempted_after_two(request: ProbeRequest) -> ProbeOutcome:
        if budget["left"] == 0:
            raise Preempted()
        budget["left"] -= 1
        return real_probe(request)

    fake._probe = preempted_after_two  # type: ignore[method-assign]
    code, _, _ = tune()
    assert code == 130
    measured = {(r.batch_size, r.min_steps, r.max_steps) for r in probes(fake)[:2]}
    assert len(measured) == 2
    fake._probe = real_probe  # type: ignore[method-assign]
    if baseline_moves:
        fake.baseline_bytes += 90 * MiB
    before = len(probes(fake))
    code, result, err = tune()
    assert code == 0, err
    again = [(r.batch_size, r.min_steps, r.max_steps) for r in probes(fake)[before:]]
    assert not measured & set(again), "a probe measured before the interruption ran again"
    trace = result["combinations"][0]["trace"]
    assert sum(1 for p in trace if p["cached"]) == 2


def test_quiet_prints_only_the_summary_line_and_log_lines_are_timestamped(fake: FakeRunner) -> None:
    code, _, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "adamw", "--no-recompute",
        "-q", "--emit", "env",
    )  # fmt: skip
    assert code == 0
    assert err.count("autobatch: 32-true/adamw/no-recompute micro-batch") == 1
    assert "probe " not in err and "device cpu" not in err and "wrote" not in err
    code, _, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "bf16-mixed", "--no-recompute"
    )
    assert code == 0
    stamped = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d probe \S+ batch \d+ (fits|oom)", err)
    assert len(stamped) >= 3


def test_quiet_with_json_leaves_stderr_to_errors_alone(fake: FakeRunner) -> None:
    """``-q --json``: the answer is on stdout, and stderr holds nothing but errors (it held the summary line, which
    a job script treating stderr as failure read as one). An error still prints under both."""
    code, result, err = tune("-q")
    assert (code, err) == (0, "") and result["chosen"]["micro_batch_size"] > 0
    code, _, err = run_main("cache", "list", "-q", "--json")
    assert (code, err) == (0, "")
    code, _, err = run_main("devices", "-q", "--json")
    assert (code, err) == (0, "")
    code, out, err = tune("-q", "--memory", "1MiB")
    assert code == 2 and out == {} and err.startswith("error: ")


def test_the_env_files_precision_set_alone_is_warned_about_as_the_env_files_name(
    fake: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AUTOBATCH_PRECISION=bf16-mixed`` for ``AUTOBATCH_PRECISIONS``: no tune reads it (it is the name the env file
    writes for the job), and the tune searched what the flags said without a word, while a mistyped setting got a
    warning. Now it gets one, naming the variable meant and whose name it is; the same names from a sourced env
    file (its plan's names all set) get none."""
    monkeypatch.setenv("AUTOBATCH_PRECISION", "bf16-mixed")
    monkeypatch.setenv("AUTOBATCH_OPTIMIZER", "sgd")
    code, result, err = tune()
    assert code == 0 and result["chosen"]["precision"] == "32-true"
    for name, meant in (
        ("AUTOBATCH_OPTIMIZER", "AUTOBATCH_OPTIMIZERS"),
        ("AUTOBATCH_PRECISION", "AUTOBATCH_PRECISIONS"),
    ):
        assert (
            f"warning: {name} is no setting's variable and is ignored (a name the env file writes for the job, "
            f"--emit env, not a setting): did you mean {meant}?"
        ) in err
    for name, value in (("MICRO_BATCH_SIZE", "16"), ("ACCUMULATION_STEPS", "2"), ("PLAN_WORLD_SIZE", "1")):
        monkeypatch.setenv(f"AUTOBATCH_{name}", value)
    code, _, err = tune()
    assert code == 0 and "AUTOBATCH_" not in err


def test_a_tune_that_chose_nothing_says_its_emit_files_were_not_written_and_why(fake: FakeRunner) -> None:
    """Recomputation asked of a model without repeated blocks: nothing is probed and nothing chosen. The tune said
    nothing of the files ``--emit`` asked for (not written), and the toml of its result said "(nothing fits)"."""
    fake.recompute_blocks = ()
    code, _, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "adamw", "--recompute",
        "--emit", "deepspeed", "--emit", "toml", "--allow-cpu",
    )  # fmt: skip
    assert code == EXIT_SCRIPT, err
    assert (
        "warning: not written: ds_config.json (deepspeed), autobatch-result.toml (toml): the tune chose nothing"
        in err
    )
    assert "no repeated blocks to wrap" in err and not Path("ds_config.json").exists()
    assert json.loads(Path("autobatch-result.json").read_text())["status"] == "complete"  # the tune's answer
    code, _, err = run_main("emit", "autobatch-result.json", "--format", "toml")
    assert code == 0, err
    header = " ".join(Path("autobatch-result.toml").read_text().replace("\n#  ", "").split())
    assert (
        "# no configuration was chosen: recomputation (full) asked for, but the model has no repeated blocks"
        in header
    )
    assert "nothing fits" not in header


def test_a_long_probe_line_is_never_wrapped_in_a_log(
    fake: FakeRunner, capfd: pytest.CaptureFixture[str]
) -> None:
    from autobatch.cli.progress import Output
    from autobatch.core.space import Combo

    reason = "fitted by less than the margin " + "x" * 400
    Output(quiet=False, live=False).probe(
        Combo("32-true", "adamw"), ProbeOutcome("oom", 90, reason=reason), False
    )
    line = capfd.readouterr().err
    assert line.count("\n") == 1 and reason in line


def test_every_command_accepts_verbose_and_quiet_after_its_name() -> None:
    import typer

    from autobatch.cli.root import app  # every command registered

    command = typer.main.get_command(app)
    seen = 0
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        for leaf in getattr(sub, "commands", {name: sub}).values():
            flags = {opt for param in leaf.params for opt in getattr(param, "opts", [])}
            assert {"--verbose", "-v", "--quiet", "-q"} <= flags, f"{name} {leaf.name}"
            seen += 1
    assert seen >= 10
    code, _, err = run_main("validate", "-q", "-v")
    assert code in (0, 2), err


def test_the_lock_makes_a_second_run_wait_and_say_for_whom(fake: FakeRunner) -> None:
    from autobatch.devices.selection import cpu_target
    from autobatch.run.locks import RunLock
    from autobatch.settings import load_settings

    target = cpu_target(1 << 30)
    lock = RunLock.device(
        target.lock_key,
        target.label,
        folder=load_settings().probe.lock_dir,
        command="autobatch tune other.py",
    )
    lock.acquire()
    threading.Timer(1.5, lock.release).start()
    started = time.monotonic()
    code, _, err = tune()
    assert code == 0, err
    assert time.monotonic() - started >= 1.4
    assert f"waiting for {target.label}: held by pid" in err and "(autobatch tune other.py) since" in err
    assert "is free after" in err


def test_cache_list_show_and_clear(fake: FakeRunner) -> None:
    assert tune()[0] == 0
    code, out, err = run_main("cache", "list", "--json")
    assert code == 0, err
    listed = json.loads(out)["entries"]
    kinds = {e["kind"]: e for e in listed}
    assert set(kinds) == {"result", "journal"}
    key = kinds["result"]["key"]
    code, out, err = run_main("cache", "show", key[:5], "--json")
    assert code == 0, err
    (shown,) = json.loads(out)
    assert shown["content"]["inputs"]["sources"].keys() == {"train.py", "model.py"}
    code, _, err = run_main("cache", "show", "zzzz")
    assert code == 2 and "no cache entry" in err
    code, _, err = run_main("cache", "clear", "--older-than", "1d")
    assert code == 0 and "removed 0 cache entries older than 1d" in err
    code, _, err = run_main("cache", "clear", "-q")
    assert code == 0 and "removed 2 cache entries" in err
    assert tune()[1]["probes"] > 0


@pytest.mark.slow
def test_two_concurrent_tunes_get_identical_results_and_never_probe_at_once(tmp_path: Path) -> None:
    """Two processes, one cache, one device, both --refresh (so that both really probe)."""
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    log = tmp_path / "probes.jsonl"
    args = ["tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-p", "bf16-mixed",
            "--refresh", "--json"]  # fmt: skip
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AUTOBATCH_") or k in KEEP}
    env.update(NO_COLOR="1", FAKE_PROBE_SECONDS="0.15")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "fake_cli.py"),
                str(log),
                "--",
                *args,
                "--output",
                f"r{i}.json",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    first, second = (json.loads(out) for out, _ in outputs)
    assert first["chosen"] == second["chosen"]
    assert [c["max_batch_size"] for c in first["combinations"]] == [
        c["max_batch_size"] for c in second["combinations"]
    ]
    assert first["probes"] > 0 and second["probes"] > 0
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({s["pid"] for s in spans}) == 2
    spans.sort(key=lambda s: s["start"])
    for before, after in zip(spans, spans[1:]):
        assert before["end"] <= after["start"], f"probes overlap: {before} and {after}"
    assert any("waiting for cpu" in err for _, err in outputs)


def test_in_a_log_the_table_and_notes_are_never_wrapped(capfd: pytest.CaptureFixture[str]) -> None:
    from autobatch.cli.tune import print_chosen, print_table
    from autobatch.records.result import Chosen, ComboResult, TuneResult

    reason = "bf16 is not native here: " + "y" * 300
    result = TuneResult(
        "train.py", [], {"name": "cpu", "budget_bytes": 1 << 30}, "throughput",
        [ComboResult("32-true", "adamw", False, "exact", 64, probes=3), ComboResult("bf16-mixed", "adamw", False, "skipped", reason=reason)],
        chosen=Chosen("32-true", "adamw", False, 64, 1, 1, 64), notes=["z" * 300],
    )  # fmt: skip
    print_table(result)
    print_chosen(result)
    err = capfd.readouterr().err
    assert any(reason in line for line in err.splitlines()), "a table cell was wrapped"
    assert any(line.endswith("z" * 300) for line in err.splitlines()), "a note was wrapped"


@pytest.mark.slow
def test_identical_tunes_on_two_devices_sharing_a_cache_compute_once(tmp_path: Path) -> None:
    """Two nodes of one type (here: two lock folders, as two hosts have) and one shared cache folder:
    the second waits for the first's result instead of measuring the same thing again."""
    import os

    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    log = tmp_path / "probes.jsonl"
    args = [
        "tune",
        "train.py",
        "--device",
        "cpu",
        "--memory",
        "1GiB",
        "-p",
        "32-true",
        "-p",
        "bf16-mixed",
        "--json",
    ]
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
        env.update(NO_COLOR="1", FAKE_PROBE_SECONDS="0.15", AUTOBATCH_CACHE_DIR=str(tmp_path / "shared-cache"),
                   AUTOBATCH_LOCK_DIR=str(tmp_path / f"node{i}-locks"))  # fmt: skip
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "tests" / "fake_cli.py"),
                    str(log),
                    "--",
                    *args,
                    "--output",
                    f"r{i}.json",
                ],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    results = [json.loads(out) for out, _ in outputs]
    assert results[0]["chosen"] == results[1]["chosen"]
    assert sorted(r["cache"]["served"] for r in results) == [False, True], (
        "exactly one computed, the other was served"
    )
    probing = {json.loads(line)["pid"] for line in log.read_text().splitlines() if '"op": "probe"' in line}
    assert len(probing) == 1
    # The run that waited says for what and since when (it may also have started after the other finished,
    # fewer probes making that likelier: then it was served from the stored result without waiting).
    waited = [err for _, err in outputs if "which another run is computing: held by pid" in err]
    assert len(waited) <= 1
