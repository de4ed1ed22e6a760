"""What the probe server imports before it forks: the step's third-party modules, never the user's own."""

from __future__ import annotations

from pathlib import Path

from autobatch.probe.warming import describe, step_imports


def test_the_scripts_third_party_imports_are_warmed_not_its_own_modules(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("X = 1\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os, json\nimport torch.nn as nn\nfrom yaml import safe_load\nimport helpers\n"
        "from helpers import X\n\ndef build_model():\n    import psutil\n"
    )
    names = step_imports(str(script))
    assert "torch" in names and "yaml" in names  # installed packages, by their top-level name
    assert "helpers" not in names  # the user's module beside the script runs user code: never here
    assert "psutil" not in names  # imported inside a function: not at the script's import
    assert "os" not in names and "json" not in names  # the standard library is already cheap


def test_adapters_warm_their_library() -> None:
    assert step_imports({"kind": "hf", "target": "gpt2", "options": {}}) == ["transformers"]
    assert step_imports({"kind": "pickled", "target": "step.pkl"}) == []


def test_a_cold_start_is_said() -> None:
    assert describe({"warmed": ["torch"], "cold": None}) is None
    assert "importing numpy started 1 thread(s)" in (
        describe({"cold": "importing numpy started 1 thread(s)"}) or ""
    )
