#!/usr/bin/env bash
# Create .venv at the repository root and install raydist with everything its
# main job and tests need. Idempotent: once installed, a second run returns at
# once unless pyproject.toml or this script changed.
#
# Order matters on a CPU-only machine:
#   1. torch==2.13.0 first (a CPU wheel lies on disk; anything else pulls CUDA),
#   2. the project and its extras (a torch pin that 2.13.0 satisfies installs nothing),
#   3. deepspeed without build isolation, so its build sees that torch and not a fresh one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
stamp=".venv/.raydist-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/bootstrap.sh ]; then
    exit 0
fi
echo "raydist: installing into .venv (a few minutes on a fresh machine)..." >&2
[ -x .venv/bin/python ] || "$py" -m venv .venv
# pip's notes about index folders this machine lacks are noise; errors still show.
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v '^WARNING: Location' >&2); }
pip install -U pip setuptools wheel
pip install "torch==2.13.0"
pip install -e ".[torch,tensorflow,ml,mlflow,lightning,dev]"
# DeepSpeed builds from source; DS_BUILD_OPS=0 keeps every op JIT-compiled (CPU here).
DS_BUILD_OPS=0 pip install --no-build-isolation "deepspeed>=0.16"
# matplotlib (Lightning imports it) lists the system's fonts once, running
# fc-list, the first time it is imported: do it here, at install, not inside
# the first program or unit test that imports Lightning.
.venv/bin/python -c "import matplotlib.font_manager" >/dev/null 2>&1 || true
touch "$stamp"
echo "raydist: .venv ready" >&2
