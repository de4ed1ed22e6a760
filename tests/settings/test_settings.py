"""Settings: layers and precedence, every kind of problem (collected), paths, generated docs, world size."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from autobatch.core.space import OBJECTIVES, OPTIMIZERS, PRECISIONS
from autobatch.errors import EXIT_USAGE, ConfigError
from autobatch.settings import (
    EMIT_FORMATS,
    FIELDS,
    GROUPS,
    DeviceSettings,
    ProbeSettings,
    SearchSettings,
    Settings,
    help_for,
    load_settings,
    render_markdown_table,
    render_starter_toml,
    resolve_world_size,
)
from autobatch.settings.load import stray_variables

ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3


def load(
    tmp_path: Path, toml: str | None = None, env: dict[str, str] | None = None, **overrides: Any
) -> Settings:
    """Load with an optional autobatch.toml in tmp_path, an explicit environment and flag overrides."""
    if toml is not None:
        (tmp_path / "autobatch.toml").write_text(toml)
    return load_settings(env=env or {}, overrides=overrides, cwd=tmp_path)


def problems(
    tmp_path: Path, toml: str | None = None, env: dict[str, str] | None = None, **overrides: Any
) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, toml, env, **overrides)
    assert info.value.exit_code == EXIT_USAGE
    return info.value.problems


# --- defaults and the shape of the settings ----------------------------------------------------------


def test_defaults_without_any_layer(tmp_path: Path) -> None:
    s = load(tmp_path)
    assert s == Settings()
    assert s.source_files == ()
    assert (s.device.device, s.device.memory, s.device.headroom) == ("auto", None, 0.10)
    assert s.search.precisions == ("32-true", "bf16-mixed") and s.search.optimizers == ("adamw",)
    assert s.search.recompute == ("off", "full", "selective", "partial") and s.search.max_batch_size == 65536
    assert (s.probe.steps, s.probe.max_steps, s.probe.confirm_steps, s.probe.timeout) == (3, 8, 10, 300.0)
    assert s.plan.objective == "throughput" and s.plan.world_size is None
    assert s.output.result == "autobatch-result.json" and s.output.emit == ()
    assert s.origin("headroom") == "default"


def test_groups_and_field_names_are_the_contract() -> None:
    assert list(GROUPS) == ["script", "device", "search", "plan", "distributed", "probe", "output", "daemon"]
    names = {info.name for info in FIELDS}
    assert len(names) == len(FIELDS), "field names must be unique across groups"
    assert {f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)} == names
    for info in FIELDS:
        assert info.env == "AUTOBATCH_" + info.name.upper()
        assert info.help and info.type
        assert Settings().get(info.name) == info.default


def test_groups_validate_on_construction_and_are_frozen() -> None:
    with pytest.raises(ConfigError, match=r"probe\.steps: expected an integer >= 3, found 1"):
        ProbeSettings(steps=1)
    with pytest.raises(ConfigError, match=r"probe\.max_steps: expected an integer >= steps \(5\), found 4"):
        ProbeSettings(steps=5, max_steps=4, confirm_steps=10)
    with pytest.raises(ConfigError, match="headroom"):
        DeviceSettings(headroom=1.5)
    search = SearchSettings(precisions=["bf16-mixed", "32-true", "bf16-mixed"])  # type: ignore[arg-type]
    assert search.precisions == ("bf16-mixed", "32-true")  # a tuple, repeats dropped, order kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        search.batch_multiple = 2  # type: ignore[misc]


def test_distributed_settings_are_checked() -> None:
    from autobatch.settings import DistributedSettings

    assert DistributedSettings().strategy == "none" and DistributedSettings().nproc_per_node == 1
    assert DistributedSettings(strategy="fsdp", nproc_per_node=2).nproc_per_node == 2
    with pytest.raises(ConfigError, match="strategy"):
        DistributedSettings(strategy="zero3", nproc_per_node=2)
    with pytest.raises(ConfigError, match=r"distributed\.nproc_per_node"):
        DistributedSettings(strategy="ddp", nproc_per_node=0)


# --- precedence: defaults < file < environment < flags --------------------------------------------------

PRECEDENCE = [
    # field, section, TOML value, env value, flag value, and what each of the three layers yields
    ("headroom", "device", 0.2, "0.3", 0.4, (0.2, 0.3, 0.4)),
    ("steps", "probe", 4, "5", 6, (4, 5, 6)),
    ("memory", "device", "1GiB", "2GiB", "3GiB", (GiB, 2 * GiB, 3 * GiB)),
    ("device", "device", "cpu", "cuda", "cuda:1", ("cpu", "cuda", "cuda:1")),
    ("precisions", "search", ["bf16-mixed"], "16-mixed,bf16-true", ["32-true"],
     (("bf16-mixed",), ("16-mixed", "bf16-true"), ("32-true",))),
    ("recompute", "search", True, "both", [False], (("full",), ("off", "full"), ("off",))),
    ("cache", "probe", False, "yes", False, (False, True, False)),
    ("emit", "output", ["json"], "env,hf=hf.json", ["deepspeed"], (("json",), ("env", "hf=hf.json"), ("deepspeed",))),
]  # fmt: skip


@pytest.mark.parametrize("name, section, in_file, in_env, in_flag, expected", PRECEDENCE)
def test_file_env_flag_precedence(tmp_path: Path, name: str, section: str, in_file: Any, in_env: str,
                                  in_flag: Any, expected: tuple[Any, Any, Any]) -> None:  # fmt: skip
    toml = tomli_w.dumps({section: {name: in_file}})
    var = "AUTOBATCH_" + name.upper()
    only_file = load(tmp_path, toml)
    with_env = load(tmp_path, toml, {var: in_env})
    with_flag = load(tmp_path, toml, {var: in_env}, **{name: in_flag})
    assert (only_file.get(name), with_env.get(name), with_flag.get(name)) == expected
    assert only_file.origin(name) == "autobatch.toml"
    assert with_env.origin(name) == var
    assert with_flag.origin(name).startswith("--")
    assert load(tmp_path, toml, {var: in_env}, **{name: None}).get(name) == expected[1], "None is 'not given'"


def test_layers_only_replace_what_they_set(tmp_path: Path) -> None:
    s = load(tmp_path, "[probe]\nsteps = 5\ntimeout = 60\n", {"AUTOBATCH_TIMEOUT": "30"}, headroom=0.25)
    assert (s.probe.steps, s.probe.timeout, s.device.headroom, s.probe.max_steps) == (5, 30.0, 0.25, 8)
    assert s.source_files == (str(tmp_path / "autobatch.toml"),)


def test_explicit_config_file_and_no_default_file(tmp_path: Path) -> None:
    (tmp_path / "autobatch.toml").write_text("[probe]\nsteps = 5\n")
    (tmp_path / "other.toml").write_text("[probe]\nsteps = 7\n")
    assert load_settings(config="other.toml", env={}, cwd=tmp_path).probe.steps == 7
    assert load_settings(env={}, cwd=tmp_path, use_default_file=False).probe.steps == 3
    assert load_settings(env={}, cwd=tmp_path).probe.steps == 5


def test_environment_parsing_and_ignored_names(tmp_path: Path) -> None:
    env = {
        "AUTOBATCH_SCRIPT_ARGS": "--name 'two words' -v",
        "AUTOBATCH_OPTIMIZERS": "sgd, adamw",
        "AUTOBATCH_RECOMPUTE": "false,true",
        "AUTOBATCH_EXACT_ALL": "1",
        "AUTOBATCH_OPTIMIZER_KWARGS": '{"adamw": {"lr": 0.001, "foreach": false}}',
        "AUTOBATCH_GLOBAL_BATCH_SIZE": "256",
        "AUTOBATCH_WORLD_SIZE": "",  # empty: not set
        "AUTOBATCH_MICRO_BATCH_SIZE": "32",  # written by the env emitter; not a setting
        "AUTOBATCH_CACHE_DIR": "/nowhere",
        "HEADROOM": "0.9",
    }
    s = load(tmp_path, env=env)
    assert s.script.script_args == ("--name", "two words", "-v")
    assert s.search.optimizers == ("sgd", "adamw") and s.search.recompute == ("off", "full")
    assert s.search.exact_all is True
    assert dict(s.search.optimizer_kwargs["adamw"]) == {"lr": 0.001, "foreach": False}
    assert s.plan.global_batch_size == 256 and s.plan.world_size is None and s.device.headroom == 0.10


def test_only_the_winning_value_is_checked(tmp_path: Path) -> None:
    assert load(tmp_path, "[probe]\nsteps = 1\n", {"AUTOBATCH_STEPS": "x"}, steps=4).probe.steps == 4


def test_dependent_defaults_follow_their_field(tmp_path: Path) -> None:
    s = load(tmp_path, "[probe]\nsteps = 12\n[search]\nbatch_multiple = 100000\n")
    assert (s.probe.max_steps, s.probe.confirm_steps, s.search.max_batch_size) == (12, 12, 100000)
    assert s.origin("max_steps") == "default, raised to steps"
    found = problems(tmp_path, "[probe]\nsteps = 5\nmax_steps = 4\n")
    assert found == [
        "autobatch.toml: probe.max_steps: expected an integer >= steps (5, from autobatch.toml), found 4"
    ]


def test_optimizer_kwargs_from_toml_tables(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        "[search.optimizer_kwargs.adamw]\nlr = 3e-4\nbetas = [0.9, 0.95]\n[search.optimizer_kwargs.sgd]\n",
    )
    assert {k: dict(v) for k, v in s.search.optimizer_kwargs.items()} == {
        "adamw": {"lr": 3e-4, "betas": [0.9, 0.95]},
        "sgd": {},
    }
    assert s.to_dict()["search"]["optimizer_kwargs"] == {
        "adamw": {"lr": 3e-4, "betas": [0.9, 0.95]},
        "sgd": {},
    }


# --- problems: each kind names its source, the key, what was expected and what was found -----------------

FILE_PROBLEMS = [
    ("[device]\nheadrom = 0.2\n", 'autobatch.toml: device.headrom: unknown key; did you mean "headroom"?'),
    ("[device]\nsteps = 4\n", 'autobatch.toml: device.steps: unknown key; "steps" belongs in [probe]'),
    ("[device]\nmemroy = 4\n", 'autobatch.toml: device.memroy: unknown key; did you mean "memory"?'),
    ("[probe]\nxyz = 4\n", "autobatch.toml: probe.xyz: unknown key; keys of [probe]: steps, max_steps, confirm_steps, timeout, cache"),
    ("[devices]\ndevice = 'cpu'\n", "autobatch.toml: [devices]: unknown section; did you mean [device]?"),
    ("headroom = 0.2\n", "autobatch.toml: headroom: settings go inside a section; write it under [device]"),
    ("device = 'cpu'\n", "autobatch.toml: device: settings go inside a section; write it under [device]"),
    ('[probe]\nsteps = "three"\n', 'autobatch.toml: probe.steps: expected an integer >= 3, found "three"'),
    ("[probe]\nsteps = true\n", "autobatch.toml: probe.steps: expected an integer >= 3, found true"),
    ("[search]\nbatch_multiple = 2.5\n", "autobatch.toml: search.batch_multiple: expected an integer >= 1, found 2.5"),
    ("[device]\nheadroom = 1.5\n", "autobatch.toml: device.headroom: expected a fraction 0 <= h < 1, found 1.5"),
    ("[device]\nheadroom = 'lots'\n", 'autobatch.toml: device.headroom: expected a fraction 0 <= h < 1, found "lots"'),
    ("[probe]\nsteps = 1\n", "autobatch.toml: probe.steps: expected an integer >= 3, found 1"),
    ("[probe]\ntimeout = 0\n", "autobatch.toml: probe.timeout: expected seconds > 0, found 0.0"),
    ("[probe]\ncache = 'yes'\n", 'autobatch.toml: probe.cache: expected true or false, found "yes"'),
    ("[search]\nbatch_multiple = 8\nmax_batch_size = 4\n",
     "autobatch.toml: search.max_batch_size: expected an integer >= batch_multiple (8, from autobatch.toml), found 4"),
    ("[search]\nprecisions = ['fp8', 'bf16-mix']\n",
     'autobatch.toml: search.precisions: expected precision names from 32-true, bf16-mixed, 16-mixed, bf16-true, '
     'found "fp8", "bf16-mix" (did you mean "bf16-mixed"?)'),
    ("[search]\nprecisions = []\n", "autobatch.toml: search.precisions: expected a list of precisions (at least one), found []"),
    ("[search]\noptimizers = ['adamx']\n", 'found "adamx" (did you mean "adam"?)'),
    ("[search]\nrecompute = 'maybe'\n", 'autobatch.toml: search.recompute: expected a list of levels, a bool, or "both", found "maybe"'),
    ("[search.optimizer_kwargs]\nadamw = 3\n", "autobatch.toml: search.optimizer_kwargs: expected a table per optimizer name, found {adamw = 3}"),
    ("[search.optimizer_kwargs.adamx]\nlr = 1\n", 'search.optimizer_kwargs: expected optimizer names from sgd, '),
    ("[device]\ndevice = 'gpu'\n", 'autobatch.toml: device.device: expected auto, cpu, cuda or cuda:N, found "gpu"'),
    ("[device]\nmemory = '2 gigs'\n", 'autobatch.toml: device.memory: expected bytes, or a size such as "2GiB", found "2 gigs"'),
    ("[device]\nmemory = 0\n", 'autobatch.toml: device.memory: expected a size above 0 bytes (such as 2GiB), found 0'),
    ("[device]\nmemory = 420\n", "autobatch.toml: device.memory: 420 without a unit is 420 bytes, less than any model "
     "needs: give a unit, such as 420MiB or 420GiB"),
    ("[device]\nmemory = '512'\n", "device.memory: 512 without a unit is 512 bytes"),
    ("[plan]\nobjective = 'max_batch'\n", 'autobatch.toml: plan.objective: expected one of throughput, max-batch, found "max_batch"; did you mean "max-batch"?'),
    ("[plan]\nworld_size = 0\n", "autobatch.toml: plan.world_size: expected an integer >= 1, found 0"),
    ("[output]\nemit = ['yaml=x.yml']\n", 'autobatch.toml: output.emit: expected formats from deepspeed, hf, lightning, accelerate, env, args, json, toml, found "yaml"'),
    ("[output]\nemit = ['json=']\n", 'autobatch.toml: output.emit: expected FORMAT or FORMAT=PATH with a non-empty PATH, found "json="'),
    ("[output]\nlightning_batch_key = 'data..bs'\n", 'autobatch.toml: output.lightning_batch_key: expected a dotted key, found "data..bs"'),
    ("[script]\nscript_args = [1, 2]\n", "autobatch.toml: script.script_args: expected a list of strings, found [1, 2]"),
    ("[device]\nheadroom = = 1\n", "autobatch.toml: line 2, column 12: not valid TOML: Invalid value"),
]  # fmt: skip


@pytest.mark.parametrize("toml, expected", FILE_PROBLEMS)
def test_each_kind_of_problem_in_a_file(tmp_path: Path, toml: str, expected: str) -> None:
    found = problems(tmp_path, toml)
    assert len(found) == 1 and expected in found[0], found


def test_problems_from_environment_and_flags_name_their_source(tmp_path: Path) -> None:
    found = problems(
        tmp_path, env={"AUTOBATCH_STEPS": "two", "AUTOBATCH_CACHE": "maybe", "AUTOBATCH_OPTIMIZER_KWARGS": "{lr: 1}"},
        headroom=1.5, precisions=["fp8"], memory="huge",
    )  # fmt: skip
    assert sorted(found) == sorted(
        [
            'AUTOBATCH_STEPS: expected an integer >= 3, found "two"',
            'AUTOBATCH_CACHE: expected true or false, found "maybe"',
            'AUTOBATCH_OPTIMIZER_KWARGS: expected a table per optimizer name (as JSON), found "{lr: 1}"',
            '--memory: expected bytes, or a size such as "2GiB", found "huge"',
            "--headroom: expected a fraction 0 <= h < 1, found 1.5",
            '--precision: expected precision names from 32-true, bf16-mixed, 16-mixed, bf16-true, found "fp8"',
        ]
    )


def test_every_problem_is_collected_before_raising(tmp_path: Path) -> None:
    toml = """
[device]
headrom = 0.2
device = "gpu"
[search]
precisions = ["fp8"]
[probe]
steps = 1
timeout = -1
[plans]
"""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, toml, {"AUTOBATCH_MAX_BATCH_SIZE": "0"}, objective="fastest")
    found = info.value.problems
    assert len(found) == 8, found
    for piece in ["device.headrom", "device.device", "search.precisions", "probe.steps", "probe.timeout",
                  "[plans]", "AUTOBATCH_MAX_BATCH_SIZE", "--objective"]:  # fmt: skip
        assert any(piece in problem for problem in found), piece
    assert str(info.value).startswith("8 problems in the settings:")
    assert info.value.hint


def test_missing_config_file_and_unknown_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        load_settings(config="nope.toml", env={}, cwd=tmp_path)
    with pytest.raises(ValueError, match="not a setting"):
        load_settings(env={}, overrides={"batch_size": 3}, cwd=tmp_path)


# --- paths ---------------------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_config_file_or_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "job.toml"
    config.write_text(
        '[script]\nscript = "../models/train.py"\n[output]\ndeepspeed_base = "ds.json"\nresult = "r.json"\n'
    )
    s = load_settings(config=config, env={}, cwd=tmp_path / "run")
    assert s.script.script == str(tmp_path / "models" / "train.py")
    assert s.output.deepspeed_base == str(tmp_path / "conf" / "ds.json")
    assert s.output.result == "r.json", "output paths stay relative to the run's working directory"
    s = load_settings(config=config, env={"AUTOBATCH_SCRIPT": "train.py"}, cwd=tmp_path / "run")
    assert s.script.script == str(tmp_path / "run" / "train.py")
    s = load_settings(config=config, env={}, overrides={"script": "/abs/train.py"}, cwd=tmp_path / "run")
    assert s.script.script == "/abs/train.py"


def test_check_paths_requires_the_script_to_exist(tmp_path: Path) -> None:
    (tmp_path / "autobatch.toml").write_text('[script]\nscript = "train.py"\n')
    assert load_settings(env={}, cwd=tmp_path).script.script == str(tmp_path / "train.py")
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, cwd=tmp_path, check_paths=True)
    assert info.value.problems == [
        f'autobatch.toml: script.script: expected an existing file, found "train.py" (as {tmp_path / "train.py"})'
    ]
    (tmp_path / "train.py").write_text("")
    assert load_settings(env={}, cwd=tmp_path, check_paths=True).script.script == str(tmp_path / "train.py")


# --- generated documentation -----------------------------------------------------------------------------


def test_starter_file_loads_back_to_the_defaults(tmp_path: Path) -> None:
    text = render_starter_toml()
    s = load(tmp_path, text)
    assert s == Settings(source_files=s.source_files)
    for info in FIELDS:
        assert re.search(rf"^(# )?({info.name} = |\[search\.{info.name}\.)", text, re.M), info.name
        assert info.env in text


def test_starter_file_examples_are_valid_settings(tmp_path: Path) -> None:
    """Uncomment every example of the starter file: it still loads, with the examples' values."""
    keys = {info.name for info in FIELDS}
    out: list[str] = []
    set_by_example: set[str] = set()
    uncomment_next = False
    for line in render_starter_toml().splitlines():
        example = re.match(r"^# (\w+) = ", line)
        active = re.match(r"^(\w+) = ", line)
        if (
            (example and example.group(1) in keys)
            or uncomment_next
            or line.startswith("# [search.optimizer_kwargs.")
        ):
            uncomment_next = line.startswith("# [search.optimizer_kwargs.")
            line = line[2:]
            set_by_example.add(line.split(" = ")[0])
        elif active and active.group(1) in set_by_example:
            continue  # the default that follows an example (script_args = [])
        out.append(line)
    s = load(tmp_path, "\n".join(out))
    for info in FIELDS:
        if info.example is not None and info.name != "recompute":
            assert s.get(info.name) != info.default, info.name
    assert s.search.recompute == ("off", "full", "selective", "partial")  # the default: no example
    assert s.device.memory == 2 * GiB and dict(s.search.optimizer_kwargs["adamw"]) == {"lr": 3e-4}


def test_help_for_names_default_variable_and_key() -> None:
    text = help_for("memory")
    assert text.endswith("Default: unset. Env AUTOBATCH_MEMORY; config device.memory.")
    assert "Default: 0.1." in help_for("headroom")
    assert "[" not in "".join(help_for(info.name) for info in FIELDS), "Typer renders help as rich markup"


def test_markdown_table_has_a_row_per_field() -> None:
    table = render_markdown_table().splitlines()
    assert len(table) == 2 + len(FIELDS)
    for row, info in zip(table[2:], FIELDS):
        assert f"`{info.name}`" in row and info.env in row and row.count(" | ") == 5


def test_the_docs_key_table_is_generated_from_the_settings() -> None:
    """docs/configuration.md holds a marker the docs build fills with the settings' own table (one source)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    built = hooks.on_page_markdown(page, page=None, config=None, files=None)
    assert render_markdown_table().strip() in built
    for info in FIELDS:
        assert f"`{info.name}`" in built and info.env in built


def test_the_emit_formats() -> None:
    assert set(EMIT_FORMATS) == {"deepspeed", "hf", "lightning", "accelerate", "env", "args", "json", "toml"}


# --- the same values through every layer (property) ------------------------------------------------------

VALUES = st.fixed_dictionaries(
    {
        "headroom": st.floats(0, 0.99, allow_nan=False),
        "steps": st.integers(3, 50),
        "memory": st.integers(1 << 20, 2**40),  # below 1 MiB a unit-less size is a unit left out
        "precisions": st.lists(st.sampled_from(PRECISIONS), min_size=1, max_size=4, unique=True),
        "optimizers": st.lists(st.sampled_from(OPTIMIZERS), min_size=1, max_size=3, unique=True),
        "recompute": st.lists(st.booleans(), min_size=1, max_size=2, unique=True),
        "objective": st.sampled_from(OBJECTIVES),
        "script_args": st.lists(st.text("ab -'\"=", min_size=1, max_size=6), max_size=3),
        "emit": st.lists(st.sampled_from(EMIT_FORMATS), max_size=3, unique=True),
        "exact_all": st.booleans(),
    }
)


def _as_env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_as_env_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


@given(VALUES)
@hyp_settings(max_examples=60, deadline=None)
def test_file_environment_and_flags_agree(values: dict[str, Any]) -> None:
    by_section: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        by_section.setdefault(next(i.group for i in FIELDS if i.name == name), {})[name] = value
    env = {f"AUTOBATCH_{k.upper()}": _as_env_text(v) for k, v in values.items()}
    env["AUTOBATCH_SCRIPT_ARGS"] = shlex.join(values["script_args"])
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "a.toml"
        config.write_text(tomli_w.dumps(by_section))
        from_file = load_settings(config=config, env={}, cwd=Path(folder))
    from_env = load_settings(env=env, use_default_file=False)
    from_flags = load_settings(env={}, overrides=values, use_default_file=False)
    assert from_file.to_dict() == from_env.to_dict() == from_flags.to_dict()
    assert json.loads(json.dumps(from_file.to_dict())) == from_file.to_dict()


# --- world size ----------------------------------------------------------------------------------------

WORLD = [
    (4, {"WORLD_SIZE": "16", "SLURM_NTASKS": "8"}, 4, "world_size setting"),
    (None, {"WORLD_SIZE": "16", "SLURM_NTASKS": "8"}, 16, "WORLD_SIZE=16"),
    (None, {"SLURM_NTASKS": "8", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4"}, 8, "SLURM_NTASKS"),
    (
        None,
        {"SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4"},
        8,
        "SLURM_GPUS_ON_NODE",
    ),
    (None, {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4(x2)"}, 8, "SLURM_NTASKS_PER_NODE"),
    (None, {"SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "8"}, 24, "SLURM_GPUS_ON_NODE"),
    (None, {"SLURM_NTASKS": "1", "SLURM_GPUS_ON_NODE": "1"}, 1, "SLURM_NTASKS"),
    (None, {"SLURM_JOB_ID": "123"}, 1, "default"),
    (None, {}, 1, "default"),
]


@pytest.mark.parametrize("value, env, world, source", WORLD)
def test_resolve_world_size(value: int | None, env: dict[str, str], world: int, source: str) -> None:
    found, where = resolve_world_size(value, env)
    assert found == world and source in where


def test_resolve_world_size_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match='WORLD_SIZE: expected an integer >= 1, found "eight"'):
        resolve_world_size(None, {"WORLD_SIZE": "eight"})
    with pytest.raises(ConfigError, match="world_size"):
        resolve_world_size(0, {})


def test_a_variable_that_reads_like_a_settings_is_named_with_the_one_meant() -> None:
    env = {
        "AUTOBATCH_GLOBAL_BATCH": "64",  # shortened
        "AUTOBATCH_MEMROY": "1GiB",  # a typo
        "AUTOBATCH_OUTPUT": "r.json",  # --output's name; its variable is AUTOBATCH_RESULT
        "AUTOBATCH_HEADROOM": "0.2",  # a setting's
        "AUTOBATCH_MY_OWN_THING": "1",  # reads like none
        "AUTOBATCH_DEVICES": "",  # empty: not set
    }
    assert stray_variables(env) == [
        ("AUTOBATCH_GLOBAL_BATCH", "AUTOBATCH_GLOBAL_BATCH_SIZE"),
        ("AUTOBATCH_MEMROY", "AUTOBATCH_MEMORY"),
        ("AUTOBATCH_OUTPUT", "AUTOBATCH_RESULT"),
    ]


def test_no_variable_autobatch_sets_itself_is_taken_for_a_mistyped_setting() -> None:
    """Every ``AUTOBATCH_*`` name the package's source sets or reads (a string literal) is a setting's, or reads
    like none, or is one the command knows as its own (a new one near a setting's name must join
    :func:`own_variables`)."""
    from autobatch.cli.options import own_variables

    package = ROOT / "autobatch"
    names = {
        m
        for path in package.rglob("*.py")
        for m in re.findall(r"[\"'](AUTOBATCH_[A-Z_]+)[\"']", path.read_text())
    }
    assert len(names) > 20
    taken = {name for name, _ in stray_variables(dict.fromkeys(names, "1"))}
    assert taken - own_variables() == set()


@pytest.mark.parametrize(
    "given, size",
    [("493879296", 493879296), ("1048576", 1 << 20), ("420MiB", 420 << 20), ("0.5GiB", 1 << 29)],
)
def test_a_size_of_bytes_without_a_unit_is_taken_from_a_mebibyte_up(
    tmp_path: Path, given: str, size: int
) -> None:
    """The benchmark's caps are bare bytes: a unit-less number is bytes from 1 MiB up (below, a unit left out)."""
    assert load(tmp_path, f"[device]\nmemory = '{given}'\n").device.memory == size
    assert load(tmp_path, memory=given).device.memory == size
