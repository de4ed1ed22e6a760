"""Random TOML documents, environment values and flag values never make settings loading raise anything
but the documented error (ConfigError, exit 2) (issue #10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autobatch.errors import ConfigError
from autobatch.settings import FIELDS, load_settings, resolve_world_size

NAMES = [info.name for info in FIELDS]
ENVS = [info.env for info in FIELDS]
SECTIONS = ["script", "device", "search", "plan", "probe", "output", "nonsense"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["2GiB", "0", "-1", "1PiB", "both", "cpu", "cuda:7", "adamw", "nan"]),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
keys = st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=10))


def toml_value(value: Any) -> str:
    """Render a value as TOML text, sometimes invalid (None, nan) on purpose."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + "}"


documents = st.lists(st.tuples(st.sampled_from(SECTIONS), keys, values), max_size=6).map(
    lambda rows: "\n".join(f"[{s}]\n{k!r} = {toml_value(v)}".replace("'", '"') for s, k, v in rows)
)
raw_documents = st.text(max_size=80)
environments = st.dictionaries(
    st.sampled_from([*ENVS, "WORLD_SIZE", "SLURM_NTASKS"]), st.text(max_size=12), max_size=5
)
flags = st.dictionaries(st.sampled_from(NAMES), values, max_size=4)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(documents, raw_documents), env=environments, overrides=flags)
def test_settings_loading_raises_only_the_documented_error(
    document: str, env: dict[str, str], overrides: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "autobatch.toml"
    path.write_text(document)
    try:
        loaded = load_settings(config=path, env=env, overrides=overrides, cwd=tmp_path)
        resolve_world_size(loaded.plan.world_size, env)
    except ConfigError as exc:
        assert exc.exit_code == 2 and exc.problems


def test_a_path_under_an_unknown_user_stays_as_given(tmp_path: Path) -> None:
    """``~0/train.py`` (no such user): Path.expanduser raises RuntimeError; settings keep the path as given."""
    loaded = load_settings(config=None, env={}, overrides={"script": "~0/train.py"}, cwd=tmp_path)
    assert str(loaded.script.script).endswith("~0/train.py")
