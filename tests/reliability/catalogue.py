"""The catalogue of bad inputs (issue #10): each one message naming the problem and the fix, a documented
exit code, and no traceback unless ``--verbose``.

Each :class:`Case` runs in one of three ways, the cheapest that still exercises the failure:

``cli``        the real command in a subprocess, for inputs refused before any probe server starts;
``inprocess``  the command's ``main()`` in this process with :class:`~.inprocess.InProcessRunner` (the
               real contract checks on the real script, no server) or a fake runner (``runner``);
``server``     the real command with the real probe server (slow: import-time behaviour of a script).

Used by ``tests/reliability/test_catalogue.py`` and ``scripts/reliability.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from autobatch.errors import (
    EXIT_DEVICE,
    EXIT_LEAK,
    EXIT_NOTHING_FITS,
    EXIT_PROBE_FAILURE,
    EXIT_SCRIPT,
    EXIT_USAGE,
)

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
BAD = TESTS / "scripts" / "bad"
#: Exit codes the README's table documents.
DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 143}
#: The arguments of a small, quick tune.
#: The tests turn the fresh-process measurement off (conftest); the cases about it turn it back on.
FRESH = {"AUTOBATCH_FRESH_BASELINE": "true"}
QUICK = ("--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "sgd", "--no-recompute")


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after `autobatch`; {tmp} is the case's folder, {bad} tests/scripts/bad
    code: int
    words: tuple[str, ...]  # each must appear in stderr (case-insensitive)
    mode: str = "inprocess"  # cli | inprocess | server
    runner: str = "script"  # inprocess: script (InProcessRunner) | fake | crash | timeout | edit
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    stdout_json: bool = False  # stdout must parse as JSON
    #: Each must not appear in stderr (case-insensitive): a wrong guess, a promise the output does not keep.
    never: tuple[str, ...] = ()
    #: Held around the run (another run holding the result file), given the case's folder.
    hold: Callable[[Path], AbstractContextManager[object]] | None = field(default=None, compare=False)
    #: What is wrong with the case's folder after the run (the file a failed run leaves), empty when right.
    after: Callable[[Path], list[str]] | None = field(default=None, compare=False)


def tune(script: str, *extra: str) -> tuple[str, ...]:
    return ("tune", script, *QUICK, *extra)


def answered(micro: object, maximum: object) -> str:
    """A complete result file whose 32-true/sgd/no-recompute has ``maximum``, chosen at ``micro``."""
    combo = {"precision": "32-true", "optimizer": "sgd", "recompute": False}
    return json.dumps({
        "schema_version": 1, "status": "complete", "script": "train.py", "script_args": [],
        "device": {"type": "cpu", "name": "cpu", "requested": "cpu", "budget_bytes": 1 << 30},
        "objective": "throughput", "combinations": [{**combo, "status": "exact", "max_batch_size": maximum}],
        "chosen": {**combo, "micro_batch_size": micro, "accumulation_steps": 1, "world_size": 1, "global_batch_size": micro},
    })  # fmt: skip


def marked_failed(name: str) -> Callable[[Path], list[str]]:
    """The result file ``name`` says the run failed, and ``emit`` refuses it (exit 2, no env file)."""

    def check(folder: Path) -> list[str]:
        from support import run_main

        data = json.loads((folder / name).read_text())
        problems = (
            []
            if data.get("status") == "failed" and data.get("chosen") is None
            else [
                f"{name} is {data.get('status')!r} with chosen {data.get('chosen')}, not failed without a choice"
            ]
        )
        code, _, _ = run_main("emit", str(folder / name), "--format", f"env={folder / 'autobatch.env'}")
        if code != EXIT_USAGE or (folder / "autobatch.env").exists():
            problems.append(f"emit on it exits {code}, expected {EXIT_USAGE} and no env file")
        return problems

    return check


def nothing_left(pid_file: str) -> Callable[[Path], list[str]]:
    """No process whose pid the script wrote to ``pid_file`` (one a line; ``{tmp}``: the case's folder) is alive."""

    def check(folder: Path) -> list[str]:
        import psutil

        started = [int(line) for line in Path(pid_file.replace("{tmp}", str(folder))).read_text().split()]
        alive = [
            p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        for pid in alive:  # the test's own leftovers: end them, once seen
            psutil.Process(pid).kill()
        return [f"processes the script started outlived the tune: {alive}"] if alive else []

    return check


@contextmanager
def another_run_writes(folder: Path) -> Iterator[object]:
    """Another process holds the lock of ``{tmp}/r.json``, as a run writing it does."""
    code = (
        "import sys, time\nfrom autobatch.run.locks import RunLock\n"
        "lock = RunLock.result_file(sys.argv[1], command='autobatch tune other.py')\n"
        "lock.acquire()\nprint('held', flush=True)\ntime.sleep(600)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(folder / "r.json")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


GOOD = "{bad}/../../../examples/mlp.py"
CASES: tuple[Case, ...] = (
    # -- the script's path -----------------------------------------------------------------------
    Case("script missing", tune("{tmp}/nope.py"), EXIT_USAGE, ("not found", "hint"), "cli"),
    Case("script is a folder", tune("{bad}"), EXIT_USAGE, ("is a folder", "hint"), "cli"),
    Case("script is not a regular file", tune("/dev/null"), EXIT_USAGE, ("not a regular file",), "cli"),
    Case("no script given", ("tune", *QUICK), EXIT_USAGE, ("no training script given", "hint"), "cli"),
    Case("script without .py imports as Python", tune("{tmp}/train"), EXIT_SCRIPT,
         ("does not define make_batch",), files={"train": "def build_model():\n    pass\n"}),
    Case("script empty", tune("{bad}/empty.py"), EXIT_SCRIPT, ("does not define build_model", "compute_loss")),
    Case("syntax error", tune("{tmp}/syntax.py"), EXIT_SCRIPT, ("SyntaxError", "fix the script"),
         files={"syntax.py": "def build_model(:\n    pass\n"}),
    Case("import error", tune("{bad}/import_error.py"), EXIT_SCRIPT, ("ModuleNotFoundError", "autobatch_no_such_module")),
    Case("sys.exit at import", tune("{bad}/exits_at_import.py"), EXIT_SCRIPT,
         ("sys.exit(2)", "argparse", "the following arguments are required: --size", "after `--`", "parse_known_args")),
    Case("sys.exit with a message at import, no argparse", tune("{bad}/exits_without_data.py"), EXIT_SCRIPT,
         ("sys.exit('set AUTOBATCH_TEST_DATA to the folder of the training set')", "ends itself at import",
          'if __name__ == "__main__"'), never=("argparse", "parse_known_args")),
    # -- the contract -------------------------------------------------------------------------------
    Case("make_batch missing", tune("{bad}/missing_make_batch.py"), EXIT_SCRIPT, ("does not define make_batch", "def make_batch")),
    Case("make_batch not callable", tune("{bad}/not_callable.py"), EXIT_SCRIPT, ("make_batch is not a function",)),
    Case("make_batch wrong signature", tune("{bad}/wrong_signature.py"), EXIT_SCRIPT, ("does not take 1 argument",)),
    Case("make_batch returns None", tune("{bad}/batch_none.py"), EXIT_SCRIPT, ("returned NoneType with no tensors",)),
    Case("make_batch returns no tensor", tune("{bad}/batch_not_tensor.py"), EXIT_SCRIPT, ("returned list with no tensors",)),
    Case("make_batch ignores its size", tune("{bad}/batch_ignores_size.py"), EXIT_SCRIPT,
         ("leading dimension is not", "check_batch_size = false")),
    Case("compute_loss not scalar", tune("{bad}/loss_not_scalar.py"), EXIT_SCRIPT, ("a tensor of shape",)),
    Case("compute_loss without grad", tune("{bad}/loss_no_grad.py"), EXIT_SCRIPT, ("does not require grad",)),
    Case("compute_loss NaN", tune("{bad}/loss_nan.py"), EXIT_SCRIPT, ("returned nan", "finite")),
    Case("compute_loss inf", tune("{bad}/loss_inf.py"), EXIT_SCRIPT, ("returned inf", "finite")),
    Case("model without parameters", tune("{bad}/no_parameters.py"), EXIT_SCRIPT, ("no trainable parameters",)),
    Case("build_model returns a string", tune("{bad}/model_not_module.py"), EXIT_SCRIPT, ("not a torch.nn.Module",)),
    Case("the script's own error", tune("{bad}/own_error.py"), EXIT_SCRIPT,
         ("raised ValueError", "labels out of range", "not an out-of-memory")),
    Case("make_batch returns tensors on the meta device", tune("{bad}/batch_on_meta.py"), EXIT_SCRIPT,
         ("make_batch(8) returned tensors on the meta device", "no data", "must return real tensors")),
    Case("KeyboardInterrupt in make_batch", tune("{bad}/interrupted_in_make_batch.py"), EXIT_SCRIPT,
         ("raised KeyboardInterrupt while", "(it carries no message)"), files={"STOP": ""}),
    # -- settings -------------------------------------------------------------------------------------
    Case("toml syntax", ("tune", "--config", "{tmp}/autobatch.toml"), EXIT_USAGE, ("autobatch.toml",), "cli",
         files={"autobatch.toml": "[device\nmemory = 1\n"}),
    Case("toml unknown key", ("tune", "--config", "{tmp}/autobatch.toml"), EXIT_USAGE, ("memroy",), "cli",
         files={"autobatch.toml": '[device]\nmemroy = "1GiB"\n'}),
    Case("toml wrong type", ("tune", "--config", "{tmp}/autobatch.toml"), EXIT_USAGE, ("headroom",), "cli",
         files={"autobatch.toml": '[device]\nheadroom = "lots"\n'}),
    Case("--memory unparsable", tune(GOOD, "--memory", "lots"), EXIT_USAGE, ("--memory", "2GiB"), "cli"),
    Case("--memory zero", tune(GOOD, "--memory", "0"), EXIT_USAGE, ("above 0 bytes",), "cli"),
    Case("--memory negative", tune(GOOD, "--memory", "-1GiB"), EXIT_USAGE, ("above 0 bytes",), "cli"),
    Case("--memory above physical memory", tune("{bad}/../args_echo.py", "--memory", "1PiB"), EXIT_USAGE,
         ("more than this machine's physical memory", "pass at most")),
    Case("headroom 1.5", tune(GOOD, "--headroom", "1.5"), EXIT_USAGE, ("--headroom", "0 <= h < 1"), "cli"),
    Case("headroom negative", tune(GOOD, "--headroom", "-0.1"), EXIT_USAGE, ("--headroom",), "cli"),
    Case("unknown precision", tune(GOOD, "-p", "bf16mixed"), EXIT_USAGE, ('did you mean "bf16-mixed"',), "cli"),
    Case("unknown optimizer", tune(GOOD, "-o", "adamww"), EXIT_USAGE, ('did you mean "adamw"',), "cli"),
    Case("global batch below world size", tune(GOOD, "-g", "2", "-w", "4"), EXIT_USAGE,
         ("smaller than the world size 4", "raise --global-batch-size"), "cli"),
    Case("steps below 3", tune(GOOD, "--steps", "1"), EXIT_USAGE, ("--steps", ">= 3"), "cli"),
    Case("timeout zero", tune(GOOD, "--timeout", "0"), EXIT_USAGE, ("--timeout",), "cli"),
    Case("unknown device", tune(GOOD, "--device", "tpu"), EXIT_USAGE, ("--device", "cuda:N"), "cli"),
    Case("bad environment value", tune(GOOD), EXIT_USAGE, ("AUTOBATCH_HEADROOM",), "cli",
         env={"AUTOBATCH_HEADROOM": "abc"}),
    Case("unknown emit format", tune(GOOD, "--emit", "yaml"), EXIT_USAGE, ("--emit", "deepspeed"), "cli"),
    # -- outputs ---------------------------------------------------------------------------------------
    Case("output is a folder", tune(GOOD, "--output", "{tmp}"), EXIT_USAGE, ("is a folder", "--output"), "cli"),
    Case("output's parent is a file", tune(GOOD, "--output", "{tmp}/f/r.json"), EXIT_USAGE,
         ("is a file, not a folder",), "cli", files={"f": "x"}),
    Case("output under /proc", tune(GOOD, "--output", "/proc/r.json"), EXIT_USAGE, ("not writable",), "cli"),
    # -- devices and answers -----------------------------------------------------------------------------
    Case("cuda without a GPU", ("tune", "{bad}/../args_echo.py", "--device", "cuda", "-p", "32-true",
         "-o", "sgd", "--no-recompute"), EXIT_DEVICE, ("torch sees no CUDA device", "--device cpu")),
    Case("nothing fits", tune("{tmp}/train.py", "--memory", "400MiB"), EXIT_NOTHING_FITS,
         ("no combination fits", "hint"), runner="fake", files={"train.py": "# fake\n"}),
    Case("probe crashes", tune("{tmp}/train.py"), EXIT_PROBE_FAILURE, ("limited by a crash at batch 33",),
         runner="crash", files={"train.py": "# fake\n"}),
    Case("probe times out", tune("{tmp}/train.py"), EXIT_PROBE_FAILURE, ("limited by a timeout at batch 33",),
         runner="timeout", files={"train.py": "# fake\n"}),
    Case("script edited between probes", tune("{tmp}/train.py"), EXIT_USAGE,
         ("changed while it was being tuned", "re-run"), runner="edit", files={"train.py": "# fake\n"}),
    # -- import-time behaviour (the real probe server) ------------------------------------------------------
    Case("prints at import with --json", tune("{bad}/prints_at_import.py", "--max-batch-size", "16", "--json"),
         0, ("chosen",), "server", stdout_json=True),
    Case("reads stdin at import", tune("{bad}/reads_stdin_at_import.py", "--max-batch-size", "16"), 0,
         ("chosen",), "server"),
    Case("import error (server)", tune("{bad}/import_error.py"), EXIT_SCRIPT, ("ModuleNotFoundError",), "server"),
    Case("sys.exit at import (server)", tune("{bad}/exits_at_import.py"), EXIT_SCRIPT,
         ("sys.exit(2)", "the following arguments are required: --size"), "server"),
    Case("make_batch returns tensors on the meta device (server)", tune("{bad}/batch_on_meta.py"), EXIT_SCRIPT,
         ("make_batch(8) returned tensors on the meta device", "must return real tensors"), "server",
         never=("rerun with --verbose",)),  # a broken contract's message says it all: no traceback promised
    Case("a bare sys.exit(1) at import (server)", tune("{tmp}/train.py"), EXIT_SCRIPT,
         ("train.py called sys.exit(1) while being imported", "ends itself at import"), "server",
         files={"train.py": 'import os\nimport sys\n\nif "LOCAL_RANK" not in os.environ:\n    print("launch me with torchrun")\n    sys.exit(1)\n'
                                  "\ndef build_model(): ...\ndef make_batch(n): ...\ndef compute_loss(m, b): ...\n"},
         never=("argparse",)),
    Case("a helper in its own session started at import (server)",
         tune("{bad}/starts_helper_at_import.py", "--max-batch-size", "16", "--no-cache"), 0, ("chosen",), "server",
         env={"HELPERS_PID_FILE": "{tmp}-helpers.txt"}, after=nothing_left("{tmp}-helpers.txt")),
    Case("only batch 1 fits, and BatchNorm fails there (server)",
         tune("{bad}/batchnorm_at_one.py", "--memory", "750MiB", "--no-cache"), EXIT_SCRIPT,
         ("Expected more than 1 value per channel when training", "batch 2 ran out of memory",
          "batch 1 is the only one that could fit", "make batch 2 fit"), "server"),
    # -- a result file that must not outlive its run, or be shared (round two, 5 and 6) ---------------------
    Case("import error over an earlier answer", tune("{bad}/import_error.py", "--output", "{tmp}/r.json"), EXIT_SCRIPT,
         ("ModuleNotFoundError", "partial result (failed, 0 probes) saved to"), files={"r.json": answered(64, 64)},
         after=marked_failed("r.json")),
    Case("result file written by another run", tune(GOOD, "--output", "{tmp}/r.json", "--lock-timeout", "1"),
         EXIT_USAGE, ("another run writes the result file", "(autobatch tune other.py)", "gave up after 1 s", "--output"),
         "cli", hold=another_run_writes),
    Case("emit: a batch that is not an integer", ("emit", "{tmp}/r.json", "--format", "env"), EXIT_USAGE,
         ("chosen.micro_batch_size: expected an integer, found 139.0", "hint"), "cli", files={"r.json": answered(139.0, 139)}),
    Case("emit: a batch above its maximum", ("emit", "{tmp}/r.json", "--format", "env"), EXIT_USAGE,
         ("chosen.micro_batch_size: 139 is larger than the maximum 64", "hint"), "cli", files={"r.json": answered(139, 64)}),
    Case("explain on a script run as it is",
         ("explain", "{bad}/../../../examples/as_is/plain_loop.py", *QUICK, "-b", "8", "--", "--batch-size", "{batch}"),
         EXIT_USAGE, ("explain breaks a peak down", "runs as it is", "autobatch check"), "cli"),
    Case("estimate on a script run as it is",
         ("estimate", "{bad}/../../../examples/as_is/plain_loop.py", "-d", "cpu", "-m", "1GiB", "--", "--batch-size",
          "{batch}"), EXIT_USAGE, ("estimate simulates", "runs as it is"), "cli"),
    Case("emit: args for a script that was not run as it is", ("emit", "{tmp}/r.json", "--format", "args"),
         EXIT_USAGE, ("writes the command line of a script tuned as it is", "--format env"), "cli",
         files={"r.json": answered(64, 64)}),
    # -- a peak that is not the batch's alone (round two, 3 and 4; the real probe server) --------------------
    Case("a peak that depends on the data, --strict", tune("{bad}/varying_length.py", "--max-batch-size", "64", "--strict"),
         EXIT_SCRIPT, ("the peak depends on the data", "different shapes", "make_batch must return the worst case"),
         "server"),
    Case("a leak", tune("{bad}/leaks_activations.py"), EXIT_LEAK,
         ("grew at every step from step 3", "per step", "keeps each step's tensors", "loss.item()"), "server"),
    # -- what recomputation wraps (round two, 2): the 4 blocks, not the 8 Linears in their MLPs' Sequentials -----
    Case("recomputation wraps the blocks, not the layers inside them",
         ("tune", "{bad}/../decoder.py", "-d", "cpu", "-m", "420MiB", "-p", "32-true", "-o", "adamw", "--recompute",
          "--max-batch-size", "2", "--no-cache", "--", "--depth", "4", "--vocab", "512", "--context", "256"), 0,
         ("recomputes Block x 4",), "server"),
    Case("data prepared and a pool started at import (server)",
         tune("{bad}/prepares_data_at_import.py", "--max-batch-size", "64", "--timeout", "60", "--no-cache"), 0,
         ("chosen",), "server"),
    # -- the job's process is fresh, probes are forked (round two, 7): counted as the job's, and said ----------
    # (a probe counting as the job's fresh process is said in tests/cli/test_fresh_process_e2e.py's tune)
    Case("a rank counts as the rank torchrun starts",
         tune(GOOD, "--strategy", "ddp", "--nproc-per-node", "2", "--max-batch-size", "8", "--no-cache"), 0,
         ("rank processes, started as torchrun starts them", "rank 1"), "server", env=FRESH),
)  # fmt: skip


@dataclass
class Ran:
    """How a case ended."""

    code: int
    stdout: str
    stderr: str  # white space folded
    seconds: float
    after: list[str] = field(default_factory=list)  # what the case's ``after`` found wrong


def prepare(case: Case, folder: Path) -> list[str]:
    """Write the case's files into ``folder``; its argv with the placeholders filled in."""
    for name, text in case.files.items():
        (folder / name).write_text(text)
    return [a.replace("{tmp}", str(folder)).replace("{bad}", str(BAD)) for a in case.argv]


def run_case(case: Case, folder: Path) -> Ran:
    with case.hold(folder) if case.hold is not None else nullcontext():
        ran = _run_case(case, folder)
    ran.after = case.after(folder) if case.after is not None else []
    return ran


def _run_case(case: Case, folder: Path) -> Ran:
    argv = prepare(case, folder)
    started = time.perf_counter()
    if case.mode in ("cli", "server"):
        case_env = {k: v.replace("{tmp}", str(folder)) for k, v in case.env.items()}
        env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT), **case_env}
        env.setdefault("AUTOBATCH_CACHE_DIR", str(folder / "cache"))
        done = subprocess.run(
            [sys.executable, "-m", "autobatch", *argv], cwd=folder, env=env, capture_output=True, text=True,
            timeout=900, stdin=subprocess.DEVNULL if case.mode == "cli" else None,
        )  # fmt: skip
        return Ran(done.returncode, done.stdout, " ".join(done.stderr.split()), time.perf_counter() - started)
    code, out, err = _in_process(case, argv, folder)
    return Ran(code, out, err, time.perf_counter() - started)


def _in_process(case: Case, argv: list[str], folder: Path) -> tuple[int, str, str]:
    from support import run_main

    from autobatch.cli.state import STATE

    old_cwd, old_factory = os.getcwd(), STATE.runner_factory
    old_env = {k: os.environ.get(k) for k in case.env}
    os.environ.update(case.env)
    os.chdir(folder)
    try:
        script = Path(argv[argv.index("tune") + 1])
        STATE.runner_factory = lambda: make_runner(case.runner, script)
        return run_main(*argv)
    finally:
        os.chdir(old_cwd)
        STATE.runner_factory = old_factory
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_runner(kind: str, script: Path) -> object:
    from autobatch.testing import FakeRunner, affine

    from .faulty import FaultyRunner
    from .inprocess import InProcessRunner

    mib = 1 << 20
    curve = affine(400 * mib, 1.7 * mib)
    if kind == "script":
        return InProcessRunner(script)
    if kind == "fake":
        return FakeRunner(curve)
    if kind in ("crash", "timeout"):
        return FaultyRunner(curve, fault=lambda request, attempt: kind if request.batch_size > 32 else None)

    def edit(request: object, attempt: int) -> None:
        runner.probes += 1
        if runner.probes == 3:
            with open(script, "a") as handle:
                handle.write("# edited while tuned\n")
        return None

    runner = FaultyRunner(curve, fault=edit)
    runner.probes = 0  # type: ignore[attr-defined]
    return runner


def judge(case: Case, ran: Ran) -> list[str]:
    """What is wrong with how a case ended (empty: handled as documented)."""
    problems = []
    if ran.code != case.code:
        problems.append(f"exit {ran.code}, expected {case.code}")
    if ran.code not in DOCUMENTED:
        problems.append(f"exit {ran.code} is not in the README's table")
    low = ran.stderr.lower()
    problems += [f"stderr lacks {w!r}" for w in case.words if w.lower() not in low]
    problems += [f"stderr has {w!r}" for w in case.never if w.lower() in low]
    if "traceback (most recent call last)" in low:
        problems.append("a traceback without --verbose")
    if case.code != 0 and "error:" not in low:
        problems.append("no 'error:' line")
    if "internal error" in low:
        problems.append("reported as an internal error")
    problems += ran.after
    if case.stdout_json:
        import json

        try:
            json.loads(ran.stdout)
        except ValueError:
            problems.append("stdout is not clean JSON")
    return problems
