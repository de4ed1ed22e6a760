"""The script's local sources: what the fingerprint reads besides the script itself."""

from __future__ import annotations

from pathlib import Path

from autobatch.cache.sources import local_sources, source_digests


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(script: Path, cwd: Path) -> set[str]:
    return set(source_digests(script, cwd))


def test_follows_local_imports_of_every_form(tmp_path: Path) -> None:
    job = tmp_path / "job"
    script = write(
        job / "train.py",
        "import json, torch\n"
        "import model\n"
        "from models.gpt import GPT\n"
        "from data import loader as L\n"
        "def build_model():\n"
        "    import lazy  # inside a function\n",
    )
    write(job / "model.py", "from helpers import act\n")
    write(job / "helpers.py", "X = 1\n")
    write(job / "models" / "__init__.py", "")
    write(job / "models" / "gpt.py", "from .blocks import Block\n")
    write(job / "models" / "blocks.py", "\n")
    write(job / "data" / "loader.py", "\n")  # a namespace package
    write(job / "lazy.py", "\n")
    write(job / "unused.py", "\n")
    assert names(script, tmp_path) == {
        "train.py",
        "model.py",
        "helpers.py",
        "models/__init__.py",
        "models/gpt.py",
        "models/blocks.py",
        "data/loader.py",
        "lazy.py",
    }


def test_the_working_folder_counts_and_the_script_folder_comes_first(tmp_path: Path) -> None:
    script = write(tmp_path / "scripts" / "train.py", "import common\nimport shared\n")
    write(tmp_path / "scripts" / "common.py", "\n")
    write(tmp_path / "common.py", "# shadowed by the script's folder\n")
    write(tmp_path / "shared.py", "\n")
    found = {p.relative_to(tmp_path).as_posix() for p in local_sources(script, tmp_path)}
    assert found == {"scripts/train.py", "scripts/common.py", "shared.py"}


def test_installed_packages_never_count(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", "import torch, numpy, typer\nimport pkg\n")
    write(tmp_path / "venv" / "lib" / "site-packages" / "pkg" / "__init__.py", "\n")
    write(tmp_path / "site-packages" / "x.py", "\n")
    assert names(script, tmp_path) == {"train.py"}


def test_a_broken_script_still_counts_by_its_bytes(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", "def broken(:\n")
    first = source_digests(script, tmp_path)
    script.write_text("def broken(:\n    pass\n")
    assert set(first) == {"train.py"} and source_digests(script, tmp_path) != first


def test_digests_change_with_a_local_module_and_not_with_an_unrelated_file(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", "import model\n")
    module = write(tmp_path / "model.py", "WIDTH = 256\n")
    write(tmp_path / "notes.py", "\n")
    before = source_digests(script, tmp_path)
    (tmp_path / "notes.py").write_text("# edited\n")
    assert source_digests(script, tmp_path) == before
    module.write_text("WIDTH = 512\n")
    assert source_digests(script, tmp_path) != before


def test_cycles_between_local_modules_end(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", "import a\n")
    write(tmp_path / "a.py", "import b\n")
    write(tmp_path / "b.py", "import a\n")
    assert names(script, tmp_path) == {"train.py", "a.py", "b.py"}
