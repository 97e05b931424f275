#!/usr/bin/env bash
# The wheel beside transformers >= 5.25, whose dependency `kernels` (Hugging Face's hub
# kernels package) is a top-level name: a fresh virtual environment gets the wheel that
# `make wheel` built (no dependencies) and `transformers>=5.25` from PyPI (network), then
# imports both `kernels` packages and checks each comes from its own distribution.
#
#   make wheel && bash examples/install/wheel_beside_transformers.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
wheel=$(ls dist/libvllm-*-manylinux_*.whl | tail -1)
env_dir=${1:-$(mktemp -d)/env}
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q --no-deps "$wheel"
"$env_dir/bin/pip" install -q "transformers>=5.25"
cd /
"$env_dir/bin/python" - <<'PY'
import importlib.metadata as md
import importlib.util as u

import kernels
import transformers

import libvllm

site = libvllm.__file__.rsplit("/libvllm/", 1)[0]
hub = kernels.__file__
ours = u.find_spec("libvllm.kernels").origin
assert hub.startswith(site + "/kernels/") and ours.startswith(site + "/libvllm/kernels/"), (hub, ours)
print(f"transformers {transformers.__version__}, kernels {md.version('kernels')} "
      f"(hub) at {hub}, libvllm {md.version('libvllm')} kernels at {ours}: both import")
PY
