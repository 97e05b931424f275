#!/usr/bin/env bash
# The wheel beside transformers >= 5.25, whose dependency `kernels` (Hugging Face's hub
# kernels package) is a top-level name: a fresh virtual environment gets the wheel that
# `make wheel` built (no dependencies) and `transformers>=5.25` from PyPI (network), then
# imports both `kernels` packages and checks each comes from its own distribution.
#
#   make wheel && bash examples/install/wheel_beside_transformers.sh [VENV_DIR]
#   (env: PYTHON, the interpreter of the wheel's cpXY tag, default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
wheels=(dist/libvllm-*-manylinux_*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "want one dist/ wheel: ${wheels[*]}"; exit 1; }
wheel=$(realpath "${wheels[0]}")
env_dir=${1:-$(mktemp -d)/env}
"${PYTHON:-.venv/bin/python}" -m venv "$env_dir"
"$env_dir/bin/pip" install -q --no-deps "$wheel"
"$env_dir/bin/pip" install -q "transformers>=5.25"
cd /
"$env_dir/bin/python" - <<'PY'
import importlib.metadata as md

import kernels
import transformers

import libvllm.capi
import libvllm.kernels

site = libvllm.__file__.rsplit("/libvllm/", 1)[0]
hub = kernels.__file__
ours = libvllm.kernels.__file__
assert hub.startswith(site + "/kernels/") and ours.startswith(site + "/libvllm/kernels/"), (hub, ours)
print(f"transformers {transformers.__version__}, kernels {md.version('kernels')} "
      f"(hub) at {hub}, libvllm {md.version('libvllm')} kernels at {ours}: both import")
PY
