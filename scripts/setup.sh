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
pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# A CPU build from the local wheel cache; an unpinned torch would pull a multi-GB CUDA build.
python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pip install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
if [ "${1:-}" = "--dev" ]; then
  pip install -q -e ".[dev,plot,consumers,bench]" 2>&1 | grep -v '^WARNING: Location' || true
  # DeepSpeed builds against the installed torch; its ops are JIT-built, none are needed to load a config.
  if ! python -c "import deepspeed" 2>/dev/null; then
    DS_BUILD_OPS=0 pip install -q --no-build-isolation deepspeed 2>&1 | grep -v '^WARNING: Location' || true
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
  pip install -q -e . 2>&1 | grep -v '^WARNING: Location' || true
fi
# Byte-compile the package (an editable install is imported from its sources): every command and probe
# process imports it, and where PYTHONDONTWRITEBYTECODE is set each would compile it again (0.2 s a process).
python -m compileall -q autobatch >/dev/null
python -c "import autobatch, torch; print(f'autobatch {autobatch.__version__} with torch {torch.__version__} in .venv')"
