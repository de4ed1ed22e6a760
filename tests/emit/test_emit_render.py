"""The emitters as pure functions: registry, specs, headers, overlays, and emit()'s render-then-write."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from emit_cases import BY_NAME, DATA, OPTIONS
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.emit import FORMATS, EmitOptions, caveats, emit, make_options, parse_emit_spec, render
from autobatch.emit import env as env_format
from autobatch.emit.common import why_none
from autobatch.emit.deepspeed import deepspeed_config, load_base
from autobatch.emit.hf import checkpointing_key
from autobatch.emit.lightning import overlay
from autobatch.emit.whole import drop_none
from autobatch.errors import UsageError
from autobatch.records.result import NO_BLOCKS, TuneResult

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

COMMENTED = ["lightning", "accelerate", "env", "toml"]


# ------------------------------------------------------------------------------ registry and specs


def test_formats_match_the_settings_vocabulary() -> None:
    settings = pytest.importorskip("autobatch.settings")
    assert tuple(FORMATS) == tuple(settings.EMIT_FORMATS)


@pytest.mark.parametrize(
    ("fmt", "filename"),
    [("deepspeed", "ds_config.json"), ("hf", "hf_training_args.json"), ("lightning", "lightning_overlay.yaml"),
     ("accelerate", "accelerate_config.yaml"), ("env", "autobatch.env"), ("json", "autobatch-result.json"),
     ("toml", "autobatch-result.toml")],
)  # fmt: skip
def test_parse_emit_spec_defaults(fmt: str, filename: str) -> None:
    assert parse_emit_spec(fmt) == (fmt, Path(filename))


def test_parse_emit_spec_with_path() -> None:
    assert parse_emit_spec("deepspeed=out/ds.json") == ("deepspeed", Path("out/ds.json"))
    assert parse_emit_spec(" env = job.env ") == ("env", Path("job.env"))


def test_unknown_format_names_the_known_ones_and_the_closest() -> None:
    with pytest.raises(UsageError) as info:
        parse_emit_spec("deepspeeed=x.json")
    assert "did you mean 'deepspeed'" in info.value.message
    assert info.value.hint and all(name in info.value.hint for name in FORMATS)


def test_empty_path_is_an_error() -> None:
    with pytest.raises(UsageError, match="empty path"):
        parse_emit_spec("hf=")


# ----------------------------------------------------------------------------- emit: render, write


def test_emit_writes_every_file(tmp_path: Path, tune_result: TuneResult, options: EmitOptions) -> None:
    every = [fmt for fmt in FORMATS if fmt != "args"]  # args: a script tuned as it is (test_emit_args.py)
    specs = [f"{fmt}={tmp_path / 'out' / FORMATS[fmt].filename}" for fmt in every]
    written = emit(tune_result, specs, options)
    assert written == [tmp_path / "out" / FORMATS[fmt].filename for fmt in every]
    for fmt, path in zip(every, written):
        assert path.read_text() == render(tune_result, fmt, options)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_rendering_error_writes_nothing(tmp_path: Path, tune_result: TuneResult) -> None:
    options = replace(OPTIONS, deepspeed_base=str(tmp_path / "missing.json"))
    specs = [("env", tmp_path / "a.env"), ("deepspeed", tmp_path / "ds.json")]
    with pytest.raises(UsageError, match="cannot read the DeepSpeed base config"):
        emit(tune_result, specs, options)
    assert list(tmp_path.iterdir()) == []


def test_nothing_chosen_is_a_usage_error_and_writes_nothing(tmp_path: Path, nothing_fits: TuneResult) -> None:
    for fmt in ("deepspeed", "hf", "lightning", "accelerate", "env"):
        with pytest.raises(UsageError, match="no configuration to emit: no combination fits") as info:
            emit(nothing_fits, [("json", tmp_path / "r.json"), (fmt, tmp_path / "x")], OPTIONS)
        assert info.value.hint and "then emit again" in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_whole_result_formats_render_without_a_choice(tmp_path: Path, nothing_fits: TuneResult) -> None:
    written = emit(nothing_fits, [("json", tmp_path / "r.json"), ("toml", tmp_path / "r.toml")], OPTIONS)
    assert TuneResult.load(written[0]) == nothing_fits
    assert (
        "# no configuration was chosen: no combination fits even the smallest batch" in written[1].read_text()
    )


def test_a_whole_result_says_why_nothing_was_chosen_in_the_tunes_words(
    tmp_path: Path, nothing_fits: TuneResult
) -> None:
    """A tune whose every combination recomputes a model without repeated blocks chose nothing, and nothing was
    probed: its toml's header said "(nothing fits)"; it says the tune's own reason, as emit's refusal does. A
    result whose tune did not finish says that."""
    nothing_fits.combinations = [
        replace(entry, status="skipped", recompute=True, recompute_level="full", reason=NO_BLOCKS, probes=0)
        for entry in nothing_fits.combinations
    ]
    text = render(nothing_fits, "toml", OPTIONS)
    assert (
        "# no configuration was chosen: recomputation (full) asked for, but the model has no repeated blocks"
        in text
    )
    assert "nothing fits" not in text
    assert caveats(nothing_fits, "deepspeed", OPTIONS) == [
        f"no configuration to emit: {why_none(nothing_fits)}"
    ]
    nothing_fits.status = "interrupted"
    assert "# no configuration was chosen: the tune that wrote this result was interrupted" in render(
        nothing_fits, "toml", OPTIONS
    )


def test_two_formats_cannot_share_a_path(tmp_path: Path, tune_result: TuneResult) -> None:
    with pytest.raises(UsageError, match="would both write"):
        emit(tune_result, [("hf", tmp_path / "x.json"), ("deepspeed", tmp_path / "x.json")], OPTIONS)


# ---------------------------------------------------------------------------- headers and comments


@pytest.mark.parametrize("fmt", COMMENTED)
def test_commented_formats_start_with_provenance_and_arithmetic(fmt: str, tune_result: TuneResult) -> None:
    text = render(tune_result, fmt, OPTIONS)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert text.startswith("# ")
    joined = "\n".join(header)
    assert "autobatch 0.1.0" in joined and "examples/gpt.py --size small" in joined
    assert "NVIDIA A100-SXM4-80GB" in joined and "tuned 2026-11-20T09:30:00+00:00" in joined
    assert "# micro-batch 12 x accumulation 5 x world 4 = global 240 (requested 240)" in header


@pytest.mark.parametrize("fmt", COMMENTED)
def test_inexact_plan_carries_its_note(fmt: str) -> None:
    text = render(BY_NAME["inexact"].result(), fmt, OPTIONS)
    assert "global 352 (requested 350)" in text
    assert "scale a linearly-scaled learning rate by 352/350" in " ".join(
        line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")
    )


@pytest.mark.parametrize("fmt", ["deepspeed", "hf", "json"])
def test_json_formats_have_no_comment(fmt: str, tune_result: TuneResult) -> None:
    assert isinstance(json.loads(render(tune_result, fmt, OPTIONS)), dict)


def test_no_request_says_so() -> None:
    text = render(BY_NAME["no_request"].result(), "env", OPTIONS)
    assert "global 128 (no global batch requested)" in text
    assert "AUTOBATCH_REQUESTED_GLOBAL_BATCH_SIZE" not in text


hostile = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)


@settings(max_examples=60, deadline=None)
@given(command=hostile, note=hostile, script=hostile)
def test_no_text_escapes_the_comment(command: str, note: str, script: str) -> None:
    """Newlines or quotes in a command, note or script path never become settings."""
    result = BY_NAME["bf16-mixed_accum_w4"].result()
    result.script = script or "s.py"
    result.chosen = replace(result.chosen, note=note or None)  # type: ignore[type-var]
    options = replace(OPTIONS, generated_by=command)
    assert yaml.safe_load(render(result, "lightning", options)) == overlay(result, options)
    accelerate = yaml.safe_load(render(result, "accelerate", options))
    assert accelerate["num_processes"] == 4 and len(accelerate) == 9
    assert TuneResult.from_dict(tomllib.loads(render(result, "toml", options))) == result
    dotenv = pytest.importorskip("dotenv")
    import io

    assert dict(
        dotenv.dotenv_values(stream=io.StringIO(render(result, "env", options)))
    ) == env_format.variables(result)


# ----------------------------------------------------------------------------------------- formats


def test_deepspeed_overlay_keeps_the_base_and_sets_only_autobatch_keys() -> None:
    base = load_base(DATA / "ds_base_zero2.json")
    before = json.dumps(base, sort_keys=True)
    config = deepspeed_config(BY_NAME["bf16-mixed_accum_w4"].chosen(), base)
    assert json.dumps(base, sort_keys=True) == before  # the base is not modified
    assert config["zero_optimization"] == base["zero_optimization"]
    assert (config["gradient_clipping"], config["steps_per_print"]) == (1.0, 50)
    assert (
        config["train_batch_size"],
        config["train_micro_batch_size_per_gpu"],
        config["gradient_accumulation_steps"],
    ) == (240, 12, 5)
    assert config["bf16"] == {"enabled": True} and "bfloat16" not in config
    assert config["fp16"]["enabled"] is False and config["fp16"]["loss_scale_window"] == 500
    assert config["optimizer"] == base["optimizer"]  # same type: the user's params stay
    assert "zero_allow_untested_optimizer" not in config


def test_deepspeed_base_without_optimizer_gets_none() -> None:
    config = deepspeed_config(BY_NAME["32-true_noaccum_w1"].chosen(), {"zero_optimization": {"stage": 3}})
    assert "optimizer" not in config and "zero_allow_untested_optimizer" not in config
    assert config["zero_optimization"] == {"stage": 3}


def test_deepspeed_other_optimizer_type_keeps_only_portable_params() -> None:
    base = {
        "optimizer": {"type": "Adam", "params": {"lr": "auto", "betas": [0.9, 0.95], "weight_decay": 0.1}}
    }
    config = deepspeed_config(BY_NAME["32-true_noaccum_w1"].chosen(), base)
    assert config["optimizer"] == {
        "type": "SGD",
        "params": {"lr": "auto", "weight_decay": 0.1, "momentum": 0.9},
    }
    assert config["zero_allow_untested_optimizer"] is True


def test_deepspeed_fp16_defaults_to_dynamic_loss_scaling() -> None:
    config = deepspeed_config(BY_NAME["16-mixed_accum_w4"].chosen(), optimizer=True)
    assert config["fp16"] == {"loss_scale": 0, "initial_scale_power": 16, "enabled": True}
    assert config["bf16"] == {"enabled": False}
    assert config["optimizer"] == {"type": "Adam", "params": {"adam_w_mode": False}}


def test_deepspeed_writes_no_optimizer_unless_asked() -> None:
    """Issue 12: without a base, the file carried {"type": "AdamW"} with no learning rate, so the HF
    Trainer and Lightning handed the optimizer to DeepSpeed, which trained at its default rate."""
    result = BY_NAME["bf16-mixed_accum_w4"].result()
    plain = json.loads(render(result, "deepspeed", OPTIONS))
    assert "optimizer" not in plain and "zero_allow_untested_optimizer" not in plain
    assert any("--deepspeed-optimizer writes one" in note for note in caveats(result, "deepspeed", OPTIONS))
    asked = replace(OPTIONS, deepspeed_optimizer=True)
    assert json.loads(render(result, "deepspeed", asked))["optimizer"] == {"type": "AdamW"}
    assert any("sets no learning rate" in note for note in caveats(result, "deepspeed", asked))


def test_deepspeed_bad_bases(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{not json at all")
    with pytest.raises(UsageError, match="not an object"):
        load_base(tmp_path / "list.json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_base(tmp_path / "broken.json")


def test_deepspeed_reads_an_hjson_base_as_deepspeed_does(tmp_path: Path) -> None:
    pytest.importorskip("hjson")
    (tmp_path / "ds.hjson").write_text('{\n  # ZeRO stage\n  "zero_optimization": {"stage": 1},\n}\n')
    assert load_base(tmp_path / "ds.hjson") == {"zero_optimization": {"stage": 1}}


@pytest.mark.parametrize(
    ("version", "key"),
    [(None, "gradient_checkpointing"), ("4.57.1", "gradient_checkpointing"), ("5.22.2", "gradient_checkpointing"),
     ("5.23.0", "activation_checkpointing"), ("5.23.0.dev0", "activation_checkpointing"), ("6.0.0", "activation_checkpointing")],
)  # fmt: skip
def test_hf_checkpointing_key_follows_the_transformers_version(version: str | None, key: str) -> None:
    assert checkpointing_key(version) == key


@pytest.mark.parametrize(
    ("optimizer", "optim", "optim_args"),
    [("sgd", "sgd", None), ("sgd-momentum", "sgd", "momentum=0.9"), ("adam", "adamw_torch", None),
     ("adamw", "adamw_torch", None), ("adamw-fused", "adamw_torch_fused", None), ("adafactor", "adafactor", None),
     ("rmsprop", "rmsprop", None), ("adagrad", "adagrad", None)],
)  # fmt: skip
def test_hf_optimizer_names(optimizer: str, optim: str, optim_args: str | None) -> None:
    result = BY_NAME["32-true_accum_w1"].result()
    result.chosen = replace(result.chosen, optimizer=optimizer)  # type: ignore[type-var]
    args = json.loads(render(result, "hf", OPTIONS))
    assert (args["optim"], args.get("optim_args")) == (optim, optim_args)


def test_hf_optimizer_names_exist_in_the_installed_transformers() -> None:
    pytest.importorskip("transformers")
    from transformers.training_args import OptimizerNames

    from autobatch.emit.hf import OPTIMIZERS

    assert {name for name, _ in OPTIMIZERS.values()} <= {o.value for o in OptimizerNames}


def test_lightning_key_must_be_dotted_and_free() -> None:
    with pytest.raises(UsageError, match="not a dotted key"):
        EmitOptions(lightning_batch_key="data..batch_size")
    with pytest.raises(UsageError, match="collides"):
        render(
            BY_NAME["32-true_accum_w1"].result(),
            "lightning",
            replace(OPTIONS, lightning_batch_key="trainer.precision"),
        )
    with pytest.raises(UsageError, match="collides"):
        render(
            BY_NAME["32-true_accum_w1"].result(),
            "lightning",
            replace(OPTIONS, lightning_batch_key="trainer.devices.n"),
        )


def test_lightning_devices_only_for_a_world_of_one() -> None:
    one = overlay(BY_NAME["bf16-mixed_accum_w1"].result(), OPTIONS)
    four = overlay(BY_NAME["bf16-mixed_accum_w4"].result(), OPTIONS)
    assert (one["trainer"]["devices"], one["trainer"]["num_nodes"]) == (1, 1)
    assert "devices" not in four["trainer"] and "num_nodes" not in four["trainer"]
    assert "trainer.devices x trainer.num_nodes = 4" in render(
        BY_NAME["bf16-mixed_accum_w4"].result(), "lightning", OPTIONS
    )


def test_env_values_and_booleans() -> None:
    values = env_format.variables(BY_NAME["16-mixed_accum_w4"].result())
    assert values == {
        "AUTOBATCH_MICRO_BATCH_SIZE": "12", "AUTOBATCH_ACCUMULATION_STEPS": "5", "AUTOBATCH_PLAN_WORLD_SIZE": "4",
        "AUTOBATCH_PLAN_GLOBAL_BATCH_SIZE": "240", "AUTOBATCH_REQUESTED_GLOBAL_BATCH_SIZE": "240",
        "AUTOBATCH_PRECISION": "16-mixed", "AUTOBATCH_OPTIMIZER": "adam", "AUTOBATCH_RECOMPUTE_ACTIVATIONS": "1",
        "AUTOBATCH_RECOMPUTE_LEVEL": "full", "AUTOBATCH_TORCH_COMPILE": "0",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "5",
    }  # fmt: skip
    # AUTOBATCH_COMMAND: a script tuned as it is (test_emit_args.py); the next two: lengths were searched
    # (tests/api/test_lengths_fake.py); the last two: the answer holds under the pinned allocator
    # (tests/cli/test_choice_fake.py)
    assert tuple(values) == env_format.ENV_NAMES[:-5]


def test_toml_drops_nulls_everywhere() -> None:
    assert drop_none({"a": None, "b": [1, None, {"c": None, "d": 2}], "e": {"f": None}}) == {
        "b": [1, {"d": 2}],
        "e": {},
    }


# ------------------------------------------------------------------------------------------- notes


def test_caveats_name_what_the_files_cannot_say() -> None:
    bf16_true = BY_NAME["bf16-true_accum_w4"].result()
    assert any("dtype=torch.bfloat16" in note for note in caveats(bf16_true, "hf", OPTIONS))
    assert any("cast to bfloat16" in note for note in caveats(bf16_true, "accelerate", OPTIONS))
    assert any("recompute" in note for note in caveats(bf16_true, "deepspeed", OPTIONS))
    adam = BY_NAME["16-mixed_accum_w1"].result()
    assert any("no plain Adam" in note for note in caveats(adam, "hf", OPTIONS))
    assert any(
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=5" in note for note in caveats(adam, "accelerate", OPTIONS)
    )
    assert caveats(BY_NAME["32-true_noaccum_w1"].result(), "env", OPTIONS) == []


def test_make_options_overrides() -> None:
    options = make_options("autobatch emit r.json", lightning_batch_key="data.micro", deepspeed_base=None)
    assert (options.generated_by, options.lightning_batch_key, options.deepspeed_base) == (
        "autobatch emit r.json",
        "data.micro",
        None,
    )


def test_emit_imports_no_torch_and_no_consumer() -> None:
    code = (
        "import sys, autobatch.emit, autobatch.cli.emit\n"
        "heavy = {'torch', 'transformers', 'lightning', 'accelerate', 'deepspeed'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
