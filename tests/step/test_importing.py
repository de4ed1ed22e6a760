"""What a script that calls sys.exit() while it is imported is told: argparse only when argparse exited."""

from __future__ import annotations

from pathlib import Path

import pytest

from autobatch.errors import ScriptError
from autobatch.step.importing import import_file


def _exit_of(tmp_path: Path, source: str) -> ScriptError:
    script = tmp_path / "train.py"
    script.write_text(source)
    with pytest.raises(ScriptError) as info:
        import_file(script)
    return info.value


def test_argparse_refusing_the_arguments_is_named_with_its_message(tmp_path: Path) -> None:
    error = _exit_of(
        tmp_path,
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float)\n"
        "ARGS = parser.parse_args(['--lr', 'fast'])\n",
    )
    assert "called sys.exit(2) while being imported: its argument parsing (argparse) refused" in error.message
    assert "argument --lr: invalid float value: 'fast'" in error.message
    assert "after `--`" in (error.hint or "")


@pytest.mark.parametrize(
    ("call", "said"),
    [
        ("sys.exit(2)", "sys.exit(2)"),
        ("sys.exit()", "sys.exit()"),
        ("sys.exit('no data')", "sys.exit('no data')"),
    ],
)
def test_any_other_exit_is_the_scripts_own_not_a_guess_at_argparse(
    tmp_path: Path, call: str, said: str
) -> None:
    error = _exit_of(tmp_path, f"import sys\n\nif True:\n    {call}\n")
    assert error.message == f"train.py called {said} while being imported: the script ends itself at import"
    assert "argparse" not in error.message + (error.hint or "")
    assert '__name__ == "__main__"' in (error.hint or "")
    assert error.detail is not None and 'train.py", line 4' in error.detail  # --verbose: where it exited
