#!/usr/bin/env bash
# Create .venv at the repository root and install raydist with everything its
# main job and tests need. Idempotent: a second run only checks what is there.
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
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip setuptools wheel
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e ".[torch,tensorflow,dev]"
# DeepSpeed builds from source; DS_BUILD_OPS=0 keeps every op JIT (CPU here).
DS_BUILD_OPS=0 "${pip[@]}" install --no-build-isolation "deepspeed>=0.16"
touch "$stamp"
