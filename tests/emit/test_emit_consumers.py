"""Every emitted file, loaded by the real library that consumes it.

DeepSpeed (its config class, in a fresh process: ``ds_consumer.py``), transformers
(``HfArgumentParser(TrainingArguments)`` and the Trainer's optimizer factory), Lightning
(``LightningCLI`` building a ``Trainer``), accelerate (``load_config_from_file`` and a real
``accelerate launch``), bash and python-dotenv (the env file), tomllib and ``TuneResult.load``.
Each test skips only when its library is not importable. Machine facts that change what a
consumer does here (no GPU) are asserted as such, not skipped.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from emit_cases import BY_NAME, CASE_IDS, CASES, DATA, OPTIONS, Case

from autobatch.emit import common, render
from autobatch.emit import env as env_format
from autobatch.records.result import TuneResult

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.consumers


def write(tmp_path: Path, case: Case, fmt: str, options: Any = OPTIONS, name: str | None = None) -> Path:
    path = tmp_path / (name or f"{case.name}.{fmt}")
    path.write_text(render(case.result(), fmt, options), encoding="utf-8")
    return path


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# --------------------------------------------------------------------------------------- DeepSpeed

DS_BASE = str(DATA / "ds_base_zero2.json")
#: autobatch optimizer -> DeepSpeedConfig.optimizer_name (DeepSpeed lower-cases its own names).
DS_NAMES = {"sgd": "SGD", "sgd-momentum": "SGD", "adam": "adam", "adamw": "adamw", "adamw-fused": "adamw",
            "adafactor": "Adafactor", "rmsprop": "RMSprop", "adagrad": "adagrad"}  # fmt: skip


@pytest.fixture(scope="module")
def deepspeed_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every case's config (plain and on the ZeRO-2 base), at its world and at a wrong one, in one process."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    folder = tmp_path_factory.mktemp("deepspeed")
    jobs, keys = [], []
    for case in CASES:
        plain = write(folder, case, "deepspeed")
        asked = write(
            folder, case, "deepspeed", replace(OPTIONS, deepspeed_optimizer=True), f"{case.name}.asked.json"
        )
        based = write(
            folder, case, "deepspeed", replace(OPTIONS, deepspeed_base=DS_BASE), f"{case.name}.base.json"
        )
        for kind, path in (("plain", plain), ("asked", asked), ("base", based)):
            for world in (case.world, case.world + 1):
                jobs.append([str(path), world])
                keys.append((case.name, kind, world))
    proc = subprocess.run(
        [sys.executable, str(HERE / "ds_consumer.py"), json.dumps(jobs)],
        capture_output=True, text=True, timeout=900, cwd=folder,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"ds_consumer failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return dict(zip(keys, json.loads(lines[-1][len("RESULT ") :])))


@pytest.mark.parametrize("kind", ["plain", "asked", "base"])
@pytest.mark.parametrize("case_id", CASE_IDS)
@pytest.mark.slow
def test_deepspeed_accepts_and_agrees(deepspeed_reports: dict, case_id: str, kind: str) -> None:
    case = BY_NAME[case_id]
    report = deepspeed_reports[(case_id, kind, case.world)]
    assert "error" not in report, report
    assert report["world_size"] == case.world
    assert report["train_batch_size"] == case.global_batch == case.micro * case.accumulation * case.world
    assert report["train_micro_batch_size_per_gpu"] == case.micro
    assert report["gradient_accumulation_steps"] == case.accumulation
    assert report["bf16"] == (case.precision in ("bf16-mixed", "bf16-true"))
    assert report["fp16"] == (case.precision == "16-mixed")
    if kind == "plain":  # no optimizer section: the training code's optimizer (and learning rate) is used
        assert report["optimizer_name"] is None and report["zero_allow_untested_optimizer"] is False
        assert report["zero_stage"] == 0
        return
    assert report["optimizer_name"] == DS_NAMES[case.optimizer]
    params = report["optimizer_params"] or {}
    assert params.get("momentum") == (0.9 if case.optimizer == "sgd-momentum" else params.get("momentum"))
    assert params.get("adam_w_mode", True) is (case.optimizer != "adam")
    assert report["zero_allow_untested_optimizer"] == (
        case.optimizer not in ("adam", "adamw", "adamw-fused", "adagrad")
    )
    if kind == "base":
        assert report["zero_stage"] == 2  # the user's ZeRO section survives the overlay
        assert params.get("lr") == 0.0003  # kept from the base optimizer
        if case.precision == "16-mixed":
            assert report["loss_scale"] == 0.0
    else:
        assert report["zero_stage"] == 0


@pytest.mark.parametrize("case_id", CASE_IDS)
@pytest.mark.slow  # the reports' process imports deepspeed and initializes it: seconds, as for the test above
def test_deepspeed_rejects_the_file_at_another_world_size(deepspeed_reports: dict, case_id: str) -> None:
    """DeepSpeed's own batch assertion runs: the same file at world + 1 fails it."""
    case = BY_NAME[case_id]
    report = deepspeed_reports[(case_id, "plain", case.world + 1)]
    assert (
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"
        in report.get("error", "")
    )


@pytest.mark.parametrize("case_id", ["32-true_noaccum_w1", "32-true_accum_w1", "no_request"])
@pytest.mark.parametrize("kind", ["asked", "base"])
@pytest.mark.slow
def test_deepspeed_builds_the_optimizer(deepspeed_reports: dict, case_id: str, kind: str) -> None:
    """deepspeed.initialize on a tiny fp32 model builds the torch optimizer the section names."""
    case = BY_NAME[case_id]
    built = deepspeed_reports[(case_id, kind, 1)]["built_optimizer"]
    expected = {
        "sgd-momentum": "torch.optim.sgd.SGD momentum=0.9",
        "rmsprop": "torch.optim.rmsprop.RMSprop momentum=0",
    }
    assert built == expected[case.optimizer]


# ------------------------------------------------------------------------------------ transformers

#: autobatch optimizer -> the class the Trainer builds, and keyword arguments it must pass.
HF_OPTIMIZERS = {
    "sgd": ("SGD", {}), "sgd-momentum": ("SGD", {"momentum": 0.9}), "adam": ("AdamW", {}), "adamw": ("AdamW", {}),
    "adamw-fused": ("AdamW", {"fused": True}), "adafactor": ("Adafactor", {}), "rmsprop": ("RMSprop", {}),
    "adagrad": ("Adagrad", {}),
}  # fmt: skip


def parse_hf(path: Path) -> Any:
    """``HfArgumentParser(TrainingArguments).parse_json_file``; on a machine without a bf16 GPU,
    transformers refuses bf16 unless ``use_cpu`` (checked here), so the same keys are then parsed with it."""
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.utils import is_torch_bf16_gpu_available

    parser = HfArgumentParser(TrainingArguments)
    data = json.loads(path.read_text())
    if data.get("bf16") and not data.get("use_cpu") and not is_torch_bf16_gpu_available():
        with pytest.raises(ValueError, match="doesn't support bf16"):
            parser.parse_json_file(path)
        (args,) = parser.parse_dict({**data, "use_cpu": True})
        return args
    (args,) = parser.parse_json_file(path)
    return args


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_hf_training_arguments(tmp_path: Path, case_id: str) -> None:
    transformers = pytest.importorskip("transformers")
    case = BY_NAME[case_id]
    options = replace(OPTIONS, transformers_version=transformers.__version__)
    path = write(tmp_path, case, "hf", options)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing.*", category=FutureWarning)
        args = parse_hf(path)
    assert args.per_device_train_batch_size == case.micro
    assert args.gradient_accumulation_steps == case.accumulation
    assert args.bf16 == (case.precision in ("bf16-mixed", "bf16-true"))
    assert args.fp16 == (case.precision == "16-mixed")
    assert args.gradient_checkpointing == case.recompute
    assert getattr(args, "activation_checkpointing", case.recompute) == case.recompute
    assert json.loads(path.read_text()).get("use_cpu", False) == (case.device == "cpu")

    from transformers import Trainer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    name, required = HF_OPTIMIZERS[case.optimizer]
    assert cls.__name__ == name
    assert {k: kwargs.get(k) for k in required} == required


def test_hf_older_key_still_parses(tmp_path: Path) -> None:
    """The file for transformers < 5.23 (gradient_checkpointing) is read by this one too."""
    pytest.importorskip("transformers")
    case = BY_NAME["32-true_accum_w4"]
    path = write(tmp_path, case, "hf", replace(OPTIONS, transformers_version="4.57.1"))
    assert "gradient_checkpointing" in json.loads(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = parse_hf(path)
    assert args.gradient_checkpointing is True and args.per_device_train_batch_size == 12


# --------------------------------------------------------------------------------------- Lightning


def lightning_cli(*configs: Path, data: str = "emit_lightning_app.TinyData", subclass: bool = False) -> Any:
    pytest.importorskip("lightning")
    pytest.importorskip("jsonargparse")
    import importlib

    from lightning.pytorch.cli import LightningCLI

    module, _, cls_name = data.rpartition(".")
    data_cls = getattr(importlib.import_module(module), cls_name)
    from emit_lightning_app import TinyModel

    args = [a for c in configs for a in ("--config", str(c))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LightningCLI(
            TinyModel, None if subclass else data_cls, run=False, args=args, save_config_callback=None,
            subclass_mode_data=subclass, trainer_defaults={"logger": False, "enable_checkpointing": False},
        )  # fmt: skip


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_lightning_cli_builds_a_trainer(tmp_path: Path, case_id: str) -> None:
    case = BY_NAME[case_id]
    cli = lightning_cli(write(tmp_path, case, "lightning", name="overlay.yaml"))
    trainer = cli.trainer
    assert cli.config["trainer"]["precision"] == case.precision
    # Lightning runs fp16 AMP only on CUDA; on the CPU it switches to bf16-mixed itself.
    runtime = "bf16-mixed" if case.precision == "16-mixed" and not cuda_available() else case.precision
    assert trainer.precision == runtime
    assert trainer.accumulate_grad_batches == case.accumulation
    assert cli.datamodule.batch_size == case.micro
    if case.world == 1:
        assert (trainer.num_devices, trainer.num_nodes) == (1, 1)
        assert trainer.world_size == 1


def test_lightning_overlay_over_a_user_config_in_subclass_mode(tmp_path: Path) -> None:
    """The overlay goes on top of the user's own config: its keys win, the rest is kept."""
    user = tmp_path / "config.yaml"
    user.write_text(
        "trainer:\n  max_epochs: 3\n  precision: 32-true\n  accumulate_grad_batches: 1\n"
        "data:\n  class_path: emit_lightning_app.TinyData\n  init_args:\n    batch_size: 1\n    num_workers: 2\n"
    )
    case = BY_NAME["bf16-mixed_accum_w1"]
    options = replace(OPTIONS, lightning_batch_key="data.init_args.batch_size")
    cli = lightning_cli(user, write(tmp_path, case, "lightning", options, "overlay.yaml"), subclass=True)
    assert cli.trainer.max_epochs == 3
    assert cli.trainer.precision == "bf16-mixed"
    assert cli.trainer.accumulate_grad_batches == 5
    assert (cli.datamodule.batch_size, cli.datamodule.num_workers) == (12, 2)


def test_lightning_custom_batch_key(tmp_path: Path) -> None:
    case = BY_NAME["32-true_accum_w4"]
    options = replace(OPTIONS, lightning_batch_key="data.micro_batch")
    cli = lightning_cli(
        write(tmp_path, case, "lightning", options, "overlay.yaml"), data="emit_lightning_app.MicroBatchData"
    )
    assert cli.datamodule.micro_batch == 12
    assert cli.trainer.accumulate_grad_batches == 5


# -------------------------------------------------------------------------------------- accelerate


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_accelerate_loads_the_launch_config(tmp_path: Path, case_id: str) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    case = BY_NAME[case_id]
    config = load_config_from_file(str(write(tmp_path, case, "accelerate", name="accelerate.yaml")))
    assert isinstance(config, ClusterConfig)
    assert config.num_processes == case.world
    assert config.mixed_precision == {"32-true": "no", "16-mixed": "fp16"}.get(case.precision, "bf16")
    expected = "NO" if case.world == 1 else ("MULTI_CPU" if case.device == "cpu" else "MULTI_GPU")
    assert config.distributed_type.value == expected
    assert config.use_cpu == (case.device == "cpu")


LAUNCHED = """
from accelerate import Accelerator
a = Accelerator()
print("LAUNCHED", a.gradient_accumulation_steps, a.mixed_precision, a.num_processes)
"""


@pytest.mark.parametrize("case_id", ["32-true_accum_w1", "cpu_bf16"])
@pytest.mark.slow
def test_accelerate_launch_reads_precision_and_accumulation(tmp_path: Path, case_id: str) -> None:
    """`accelerate launch --config_file` with the env file's variables: Accelerator() sees both numbers.
    Two launches cover both precisions, two accumulations and both devices' configs (a GPU job's and a CPU
    job's); each launch imports accelerate and torch twice, launcher and script."""
    pytest.importorskip("accelerate")
    dotenv = pytest.importorskip("dotenv")
    case = BY_NAME[case_id]
    config = write(tmp_path, case, "accelerate", name="accelerate.yaml")
    variables = dotenv.dotenv_values(write(tmp_path, case, "env", name="autobatch.env"))
    script = tmp_path / "train.py"
    script.write_text(LAUNCHED)
    launcher = Path(sys.executable).with_name("accelerate")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ACCELERATE_")}
    proc = subprocess.run(
        [str(launcher), "launch", "--config_file", str(config), str(script)],
        capture_output=True, text=True, timeout=300, env={**env, **variables}, cwd=tmp_path,
    )  # fmt: skip
    line = [x for x in proc.stdout.splitlines() if x.startswith("LAUNCHED")]
    assert proc.returncode == 0 and line, proc.stderr[-2000:]
    precision = "no" if case.precision == "32-true" else "bf16"
    assert line[0].split()[1:] == [str(case.accumulation), precision, "1"]


@pytest.mark.slow
def test_a_cpu_world_of_two_says_how_accelerate_starts_its_ranks(tmp_path: Path) -> None:
    """A CPU plan of world 2: `accelerate launch --config_file` alone starts one process (MULTI_CPU goes through
    mpirun only with a hostfile), as the file's caveat says; torchrun with ACCELERATE_USE_CPU, which the caveat
    names, starts both ranks and each Accelerator() sees the world (without it, each sees a world of 1)."""
    case = replace(BY_NAME["cpu_bf16"], name="cpu_w2", world=2, requested=192)
    config = write(tmp_path, case, "accelerate", name="accelerate.yaml")
    assert (
        "CPU world 2: accelerate launch starts MULTI_CPU's 2 processes only through mpirun"
        in config.read_text()
    )
    script = tmp_path / "train.py"
    script.write_text(LAUNCHED)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ACCELERATE_")}

    def processes(*launch: str, **extra: str) -> set[str]:
        proc = subprocess.run([*launch, str(script)], capture_output=True, text=True, timeout=300,
                              env={**env, **extra}, cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {x.split()[-1] for x in proc.stdout.splitlines() if x.startswith("LAUNCHED")}

    bin_dir = Path(sys.executable).parent
    assert processes(str(bin_dir / "accelerate"), "launch", "--config_file", str(config)) == {"1"}
    torchrun = (str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "2")
    assert "ACCELERATE_USE_CPU=true torchrun --standalone --nproc-per-node 2" in config.read_text()
    assert processes(*torchrun, ACCELERATE_USE_CPU="true") == {"2"}
    assert processes(*torchrun) == {"1"}  # why the caveat names the variable


# ---------------------------------------------------------------------------------- env, json, toml


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_env_file_reads_the_same_in_bash_and_dotenv(tmp_path: Path, case_id: str) -> None:
    case = BY_NAME[case_id]
    path = write(tmp_path, case, "env", name="autobatch.env")
    expected = env_format.variables(case.result())
    proc = subprocess.run(
        ["bash", "-c", 'set -a; source "$1"; env -0', "bash", str(path)],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    from_bash = dict(item.split("=", 1) for item in proc.stdout.split("\0") if "=" in item)
    assert {k: from_bash.get(k) for k in expected} == expected
    assert expected["AUTOBATCH_MICRO_BATCH_SIZE"] == str(case.micro)
    assert expected["AUTOBATCH_PLAN_GLOBAL_BATCH_SIZE"] == str(case.global_batch)
    dotenv = pytest.importorskip("dotenv")
    assert dict(dotenv.dotenv_values(path)) == expected


def test_env_names_are_not_settings() -> None:
    """Sourcing the env file must not change what the next `autobatch tune` searches."""
    settings = pytest.importorskip("autobatch.settings")
    setting_names = {info.env for info in settings.FIELDS}
    assert not setting_names & set(env_format.ENV_NAMES)
    assert all(
        name.startswith((settings.ENV_PREFIX, "ACCELERATE_", "MALLOC_")) for name in env_format.ENV_NAMES
    )


@pytest.mark.parametrize("case_id", ["bf16-mixed_accum_w4", "inexact", "cpu_bf16"])
def test_json_reloads_as_the_same_result(tmp_path: Path, case_id: str) -> None:
    result = BY_NAME[case_id].result()
    path = write(tmp_path, BY_NAME[case_id], "json", name="result.json")
    assert TuneResult.load(path) == result


@pytest.mark.parametrize("case_id", ["bf16-mixed_accum_w4", "inexact", "cpu_bf16", "no_request"])
def test_toml_reloads_as_the_same_result(tmp_path: Path, case_id: str) -> None:

    result = BY_NAME[case_id].result()
    data = tomllib.loads(render(result, "toml", OPTIONS))
    assert TuneResult.from_dict(data) == result


def test_make_options_reads_the_installed_transformers() -> None:
    options = common.make_options("autobatch emit r.json --format hf")
    assert options.transformers_version == common.installed_version("transformers")
    assert options.generated_at is not None and options.generated_at.endswith("+00:00")
