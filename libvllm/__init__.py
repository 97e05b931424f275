"""libvllm: the one distribution namespace of this project's Python packages (vLLM's
counterpart is its `vllm` package).

libvllm.engine, libvllm.capi and libvllm.kernels are the repository's engine/, capi/ and
kernels/ (setup.py's packages, pyproject.toml's package-dir); a wheel holds them under
libvllm/ and installs no other top-level name. In a checkout, libvllm/engine,
libvllm/capi and libvllm/kernels are symlinks to those folders: with the repository root
on sys.path (pytest, `python -m examples...`, build/libvllm.cfg, PYTHONPATH=.) this
checkout's packages import under the one name, ahead of an editable install of another
checkout. Nothing imports them as top-level engine / capi / kernels: each module has one
name (tests/test_namespace.py).
"""
