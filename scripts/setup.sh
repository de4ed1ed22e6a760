#!/usr/bin/env bash
# Create ./.venv and install autobatch into it (CPU torch pinned for development; users bring their own).
#   bash scripts/setup.sh          runtime only
#   bash scripts/setup.sh --dev    plus test tools and the consumer libraries the tests load emitted files with
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
DEV=""
[ "${1:-}" = "--dev" ] && DEV=1
# --dev installs with uv where it can be had (two thirds of pip's time here; the suite's command includes the
# setup). uv reads none of pip's settings: the index, links and constraints pip is set up with are passed on,
# as pip would use them (the environment's over the files', `install` over `global`).
UV=()
if [ -n "$DEV" ] && pip install -q uv 2>/dev/null && [ -x .venv/bin/uv ]; then
  mapfile -t settings < <(python - <<'PY'
import subprocess, sys

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
rank = {"global": 0, "install": 1, ":env:": 2}
chosen: dict[str, tuple[int, str]] = {}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    scope, _, name = key.rpartition(".")
    if name in flags and rank.get(scope, -1) >= chosen.get(name, (-1, ""))[0]:
        chosen[name] = (rank.get(scope, -1), value.strip("'\""))
for name, (_, value) in chosen.items():
    for item in value.split():
        print(flags[name])
        print(item)
PY
)
  UV=(.venv/bin/uv pip install -q --python .venv/bin/python --index-strategy unsafe-best-match --compile-bytecode
      "${settings[@]}")
else
  pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
fi
install() {
  if [ ${#UV[@]} -gt 0 ]; then
    "${UV[@]}" "$@"
  else
    pip install -q "$@" 2>&1 | grep -v '^WARNING: Location' || true
  fi
}
# A CPU build from the local wheel cache; an unpinned torch would pull a multi-GB CUDA build.
TORCH=torch==2.13.0
python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null && TORCH=""
if [ -n "$DEV" ]; then
  install ${TORCH:+"$TORCH"} -e ".[dev,plot,consumers,bench]"
  # DeepSpeed builds against the installed torch; its ops are JIT-built, none are needed to load a config.
  if ! python -c "import deepspeed" 2>/dev/null; then
    DS_BUILD_OPS=0 install --no-build-isolation deepspeed
  fi
  # The consumer tests load emitted files with these libraries, run the integrations and read saved data
  # sets (datasets): a dev setup without one of them is broken, not a reason to skip tests.
  python - <<'PY'
import importlib, sys
names = ("transformers", "lightning", "accelerate", "deepspeed", "jsonargparse", "dotenv", "hjson", "cloudpickle", "jsonschema", "datasets")
missing = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:  # an ImportError, or a library that breaks while importing
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("setup.sh --dev: cannot import " + "; ".join(missing))
PY
else
  install ${TORCH:+"$TORCH"} -e .
fi
# Byte-compile the package (an editable install is imported from its sources): every command and probe
# process imports it, and where PYTHONDONTWRITEBYTECODE is set each would compile it again (0.2 s a process).
python -m compileall -q autobatch >/dev/null
python -c "import autobatch, torch; print(f'autobatch {autobatch.__version__} with torch {torch.__version__} in .venv')"
