"""Script specs: where the step comes from, how the settings choose it, and how contract.py loads each kind."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import cloudpickle
import pytest

from autobatch.errors import ContractError, ScriptError, UsageError
from autobatch.settings import load_settings
from autobatch.step.contract import load_script, load_spec
from autobatch.step.spec import ScriptSpec, is_reference, select_spec

STEP = """
def build_model():
    return "model"

def make_batch(batch_size):
    return [batch_size]

def compute_loss(model, batch):
    return (model, batch)

RECOMPUTE_CLASSES = "Block"
"""


@pytest.mark.parametrize(
    "text, expected",
    [("pkg.train:step", True), ("train:STEP", True), ("pkg.mod:obj.attr", True), ("train.py", False),
     ("models/train.py:Lit", False), ("pkg.mod", False), ("C:/x.py", False), ("a:b.py", False)],
)  # fmt: skip
def test_references_are_told_from_paths(text: str, expected: bool) -> None:
    assert is_reference(text) is expected


def values(**given: object) -> dict[str, object]:
    return {"script": None, "hf": None, "lightning": None, **given}


def test_the_source_given_at_the_highest_layer_wins() -> None:
    origins = {"script": "autobatch.toml", "hf": "--hf"}
    spec = select_spec(values(script="train.py", hf="cfg.json"), lambda n: origins.get(n, "default"))
    assert spec.kind == "hf" and spec.target == "cfg.json"
    origins = {"script": "SCRIPT", "hf": "AUTOBATCH_HF"}
    assert select_spec(values(script="t.py", hf="c.json"), lambda n: origins.get(n, "default")).kind == "path"


def test_two_sources_at_one_layer_and_stray_options_are_errors() -> None:
    flags = {"script": "SCRIPT", "lightning": "--lightning", "hf_task": "--hf-task"}
    with pytest.raises(UsageError, match="script and lightning both name the training step"):
        select_spec(values(script="t.py", lightning="t.py:Lit"), lambda n: flags.get(n, "default"))
    with pytest.raises(UsageError, match="hf_task .* goes with hf"):
        select_spec(values(script="t.py", hf_task="causal-lm"), lambda n: flags.get(n, "default"))
    with pytest.raises(UsageError, match="no training script given"):
        select_spec(values(), lambda n: "default")


def test_a_reference_in_the_settings_stays_a_reference(tmp_path: Path) -> None:
    (tmp_path / "autobatch.toml").write_text(
        '[script]\nscript = "pkg.train:step"\nlightning = "models/lit.py:LitModel"\n'
    )
    settings = load_settings(cwd=tmp_path, env={})
    assert settings.script.script == "pkg.train:step"  # not resolved as a path
    assert settings.script.lightning == f"{tmp_path}/models/lit.py:LitModel"  # the file part is
    spec = select_spec(values(script=settings.script.script), lambda n: "SCRIPT", cwd=tmp_path)
    assert spec.kind == "reference" and spec.sys_path == (str(tmp_path),)


def test_specs_cross_as_records_and_a_path_as_itself(tmp_path: Path) -> None:
    spec = ScriptSpec("hf", "cfg.json", {"task": "causal-lm"}, label="hf:cfg.json")
    assert ScriptSpec.from_dict(spec.to_dict()) == spec
    assert ScriptSpec.file(tmp_path / "t.py").to_init() == str(tmp_path / "t.py")


def test_a_path_spec_fingerprints_as_the_script_did(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(STEP)
    assert ScriptSpec.file(tmp_path / "t.py").content() == STEP.encode()  # earlier probe caches stay valid


def test_a_reference_loads_the_module_or_its_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "steps_pkg_for_spec"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        STEP + "\nclass Holder:\n" + "".join(f"    {line}\n" for line in STEP.splitlines())
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    whole = ScriptSpec("reference", "steps_pkg_for_spec.train", sys_path=(str(tmp_path),))
    script = load_spec(whole, ["--x", "1"])
    assert script.make_batch(3) == [3] and script.recompute_classes == ("Block",)
    assert sys.argv == ["steps_pkg_for_spec.train", "--x", "1"]
    holder = load_script(ScriptSpec("reference", "steps_pkg_for_spec.train:Holder").to_dict())
    assert holder.compute_loss("m", "b") == ("m", "b")
    assert b"def build_model" in whole.content()  # the module's source is fingerprinted
    with pytest.raises(UsageError, match="has no attribute 'Missing'"):
        load_spec(ScriptSpec("reference", "steps_pkg_for_spec.train:Missing"))
    with pytest.raises(UsageError, match="no module named"):
        load_spec(ScriptSpec("reference", "no_such_module_anywhere:step"))


def test_callables_defined_in_a_function_load_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    width = 7

    def build() -> str:
        return f"model-{width}"

    def batch_of(batch_size: int) -> list[int]:
        return [batch_size] * width

    payload = tmp_path / "step.pkl"
    payload.write_bytes(cloudpickle.dumps(types.SimpleNamespace(build_model=build, make_batch=batch_of)))
    monkeypatch.delitem(sys.modules, "transformers", raising=False)  # a script that never imported it
    with pytest.raises(ContractError, match="does not define compute_loss"):
        load_spec(ScriptSpec("pickled", str(payload), label="<callables>"))

    class Step:
        build_model = staticmethod(build)
        make_batch = staticmethod(batch_of)

        @staticmethod
        def compute_loss(model: str, batch: list[int]) -> int:
            return len(batch)

    payload.write_bytes(cloudpickle.dumps(Step()))
    script = load_spec(ScriptSpec("pickled", str(payload), label="<Step>"))
    assert script.build_model() == "model-7" and script.compute_loss("m", script.make_batch(2)) == 7


def test_an_error_while_loading_names_the_step(tmp_path: Path) -> None:
    payload = tmp_path / "bad.pkl"
    payload.write_bytes(b"not a pickle")
    with pytest.raises(ScriptError, match="<mine> raised UnpicklingError while being imported"):
        load_spec(ScriptSpec("pickled", str(payload), label="<mine>"))
