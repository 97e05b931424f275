"""The engine's configuration: EngineConfig (user intent) and the ResolvedConfig of the one
resolve step are frozen, nothing writes them, vllm.h's defaults are EngineConfig's, and
every environment variable is read through engine/envs.py (kernels/envs.py in kernels/).

The resolve cases follow vLLM 0.33 vllm/engine/arg_utils.py (get_batch_defaults,
_set_default_max_num_seqs_and_batched_tokens_args), vllm/config/vllm.py (cudagraph mode
with enforce_eager, _set_cudagraph_sizes) and vllm/config/scheduler.py
(verify_max_model_len), re-expressed for resolve_config. The scans parse the tree (never
import it) and name each offending line as file:line.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import cffi
import pytest

from libvllm.capi.header import api_cdef
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, UnsupportedError
from libvllm.engine.resolved_config import (
    CacheConfig,
    CompilationConfig,
    DeviceFacts,
    ResolvedConfig,
    SchedulerConfig,
    resolve_config,
)

ROOT = Path(__file__).resolve().parent.parent
FROZEN = (EngineConfig, ResolvedConfig, SchedulerConfig, CacheConfig, CompilationConfig,
          DeviceFacts)
FIELDS = {f.name for cls in FROZEN for f in dataclasses.fields(cls)}
# the names the tree gives these objects (a base whose last name matches is a config)
CONFIG_NAME = re.compile(r"^(config|cfg|resolved|sched|cache|compilation|\w+_config)$")
RESOLVE_MODULE = "engine/resolved_config.py"  # the one resolve step, and only it
SCANNED = ("engine", "capi", "examples")
H200 = DeviceFacts("cuda", "NVIDIA H200", 140 << 30)
CPU = DeviceFacts("cpu")


def _tail(node: ast.expr) -> str:
    """The last name of an expression: `a.b.config` -> "config"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def config_writes(path: Path, root: Path = ROOT) -> list[str]:
    """'file:line: code' for each write on a config object in path: an attribute
    assignment (=, +=, del) of a config field on a config-named base,
    dataclasses.replace(<config>, ...), object.__setattr__ and setattr(<config>, ...)."""
    hits = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        bad = False
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) \
                else [node.target]
            bad = any(isinstance(t, ast.Attribute) and t.attr in FIELDS
                      and CONFIG_NAME.match(_tail(t.value)) for t in targets)
        elif isinstance(node, ast.Call):
            fn, args = node.func, node.args
            name = _tail(fn)
            if name == "__setattr__" and isinstance(fn, ast.Attribute) \
                    and _tail(fn.value) == "object":
                bad = True
            elif name in ("replace", "setattr") and args and CONFIG_NAME.match(_tail(args[0])):
                bad = name == "setattr" or not isinstance(fn, ast.Attribute) \
                    or _tail(fn.value) == "dataclasses"
        if bad:
            hits.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: "
                                      f"{ast.unparse(node)[:80]}"))
    return [h for _, h in sorted(hits)]


def _py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_no_config_writes_outside_the_resolve_step():
    hits = [h for p in _py_files(*SCANNED) if p.relative_to(ROOT).as_posix() != RESOLVE_MODULE
            for h in config_writes(p)]
    assert not hits, "configs are written only by resolve_config:\n" + "\n".join(hits)


def test_scan_sees_every_kind_of_write(tmp_path: Path):
    src = tmp_path / "w.py"
    src.write_text("import dataclasses\nfrom dataclasses import replace\n"
                   "def f(config, self, req):\n"
                   "    config.max_num_seqs = 1\n"  # 4
                   "    self.config.block_size += 16\n"  # 5
                   "    dataclasses.replace(self.resolved, seed=1)\n"  # 6
                   "    replace(cfg, seed=2)\n"  # 7
                   "    object.__setattr__(x, 'seed', 3)\n"  # 8
                   "    setattr(config, 'seed', 4)\n"  # 9
                   "    req.max_num_seqs = 1\n"  # not a config
                   "    config.other = 1\n"  # not a config field
                   "    self.hybrid = replace(self.hybrid, num_blocks=2)\n")
    assert [h.split(": ")[0].rsplit(":", 1)[1] for h in config_writes(src, tmp_path)] == \
        ["4", "5", "6", "7", "8", "9"]


@pytest.mark.parametrize("cls", FROZEN, ids=lambda c: c.__name__)
def test_config_classes_are_frozen(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_writes_raise_frozen_instance_error():
    config = EngineConfig("m")
    resolved = resolve_config(config, 2048, CPU)
    for obj, name in ((config, "max_num_seqs"), (resolved, "device"),
                      (resolved.scheduler, "max_num_seqs"), (resolved.cache, "block_size"),
                      (resolved.compilation, "cudagraph_mode")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, getattr(obj, name))


# ---- environment variables: engine/envs.py and kernels/envs.py are the only readers ----


def env_reads(path: Path, root: Path = ROOT) -> list[str]:
    """'file:line: code' for each os.environ / os.getenv / os.putenv use in path."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb") \
                and _tail(node.value) == "os":
            hits.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: "
                                      f"{ast.unparse(node)}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv") for a in node.names):
            hits.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: "
                                      f"{ast.unparse(node)}"))
    return [h for _, h in sorted(hits)]


@pytest.mark.parametrize("package", ["engine", "kernels"])
def test_environment_read_only_through_envs(package):
    own = f"{package}/envs.py"
    hits = [h for p in _py_files(package) if p.relative_to(ROOT).as_posix() != own
            for h in env_reads(p)]
    assert not hits, f"read environment variables through {own}:\n" + "\n".join(hits)


def test_env_scan_sees_reads(tmp_path: Path):
    src = tmp_path / "e.py"
    src.write_text("import os\nfrom os import environ\nos.environ.get('A')\n"
                   "os.getenv('B')\nx = os.path.join('a')\n")
    assert [h.split(": ")[0].rsplit(":", 1)[1] for h in env_reads(src, tmp_path)] == \
        ["2", "3", "4"]


def test_envs_read_lazily_with_vllms_parsers(monkeypatch):
    from libvllm.engine import envs

    monkeypatch.setenv("VLLM_ENFORCE_STRICT_TOOL_CALLING", "0")
    assert envs.VLLM_ENFORCE_STRICT_TOOL_CALLING is False
    monkeypatch.delenv("VLLM_ENFORCE_STRICT_TOOL_CALLING")
    assert envs.VLLM_ENFORCE_STRICT_TOOL_CALLING is True
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "2")
    with pytest.raises(InvalidArgumentError, match="VLLM_ENABLE_V1_MULTIPROCESSING must be"):
        _ = envs.VLLM_ENABLE_V1_MULTIPROCESSING
    monkeypatch.setenv("VLLM_XGRAMMAR_CACHE_MB", "x")
    with pytest.raises(InvalidArgumentError, match="must be an integer"):
        _ = envs.VLLM_XGRAMMAR_CACHE_MB
    with pytest.raises(AttributeError):
        _ = envs.NOT_A_VARIABLE


# ---- vllm.h's defaults are EngineConfig's ----

# vllm_engine_params fields with no EngineConfig counterpart (the ABI's own)
C_ONLY = {"struct_size", "chat_template", "progress_callback", "progress_callback_user_data"}


@pytest.mark.capi
def test_c_engine_params_defaults_equal_engine_config(built):
    """vllm_engine_params_init (the library, loaded in cffi's ABI mode) writes each
    EngineConfig default: the same number, 0 for a None default (vllm.h's "unset"),
    NULL for every string (the flag's default)."""
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    lib = ffi.dlopen(str(built / "libvllm.so"))
    p = ffi.new("vllm_engine_params *")
    lib.vllm_engine_params_init(p, ffi.sizeof(p[0]))
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    checked = []
    for name, field in ffi.typeof("vllm_engine_params").fields:
        if name in C_ONLY:
            continue
        assert name in defaults, f"vllm_engine_params.{name} is no EngineConfig field"
        c, py = getattr(p, name), defaults[name]
        if field.type.kind == "pointer":
            assert c == ffi.NULL, name
        elif py is None:
            assert c == 0, name
        elif isinstance(py, float):
            assert c == pytest.approx(py, rel=1e-6), name  # a C float
        else:
            assert c == int(py), name
        checked.append(name)
    assert {"block_size", "gpu_memory_utilization", "tensor_parallel_size",
            "max_num_seqs", "enable_prefix_caching"} <= set(checked)


# ---- the resolve step ----


@pytest.mark.parametrize("device, seqs, tokens", [(H200, 1024, 16384), (CPU, 256, 8192)],
                         ids=["h200", "cpu"])
def test_resolve_fills_device_batch_defaults(device, seqs, tokens):
    r = resolve_config(EngineConfig("m"), 4096, device)
    assert (r.scheduler.max_num_seqs, r.scheduler.max_num_batched_tokens) == (seqs, tokens)
    assert r.scheduler.max_model_len == 4096 and r.device == device.type
    assert r.scheduler.async_scheduling == (device.type == "cuda")  # vLLM: on unless CPU
    assert r.compilation.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert r.compilation.cudagraph_capture_sizes[-1] == min(2 * seqs, 1024)
    # vllm.h's 0 is "unset" as None is; a set value wins
    assert resolve_config(EngineConfig("m", max_num_seqs=0, max_model_len=0), 4096,
                          device) == r
    assert resolve_config(EngineConfig("m", max_num_seqs=8), 4096,
                          device).scheduler.max_num_seqs == 8


def test_resolve_without_chunked_prefill_takes_the_context():
    r = resolve_config(EngineConfig("m", enable_chunked_prefill=False), 4096, CPU)
    assert r.scheduler.max_num_batched_tokens == 4096
    assert resolve_config(EngineConfig("m", enable_chunked_prefill=False), 1024,
                          CPU).scheduler.max_num_batched_tokens == 2048


def test_resolve_checks_as_vllm():
    with pytest.raises(InvalidArgumentError, match=r"max_model_len \(8192\) is greater"):
        resolve_config(EngineConfig("m", max_model_len=8192), 4096, CPU)
    with pytest.raises(InvalidArgumentError, match=r"must be greater than or equal to "
                                                   r"max_num_seqs \(16\)"):
        resolve_config(EngineConfig("m", max_num_batched_tokens=8, max_num_seqs=16), 4096,
                       CPU)
    with pytest.raises(InvalidArgumentError, match="consistent"):
        resolve_config(EngineConfig("m", cudagraph_capture_sizes=[1, 8],
                                    max_cudagraph_capture_size=16), 4096, CPU)


def test_resolve_eager_and_graph_modes():
    eager = resolve_config(EngineConfig("m", enforce_eager=True), 4096, H200).compilation
    assert eager.cudagraph_mode == "NONE" and eager.capture_sizes() == []
    assert resolve_config(EngineConfig("m", cudagraph_mode="PIECEWISE"), 4096,
                          H200).compilation.cudagraph_mode == "FULL"


def test_resolve_hybrid_block_size_and_mamba_mode():
    """The hook gets the resolved mamba_cache_mode and context; its block size is used."""
    seen = []

    def hybrid(mode: str, max_len: int) -> int:
        seen.append((mode, max_len))
        return 64

    r = resolve_config(EngineConfig("m", max_model_len=1024), 4096, CPU, hybrid)
    assert (r.cache.block_size, r.cache.mamba_cache_mode) == (64, "align")
    r = resolve_config(EngineConfig("m", enable_prefix_caching=False), 4096, CPU, hybrid)
    assert r.cache.mamba_cache_mode == "none"
    assert seen == [("align", 1024), ("none", 4096)]
    assert resolve_config(EngineConfig("m"), 4096, CPU).cache.block_size == 16


def test_resolve_hybrid_full_graphs_as_vllm(caplog):
    """vLLM's CompilationConfig: FULL with the GDN backend's UNIFORM_BATCH support becomes
    FULL_AND_PIECEWISE with its warning; the default and FULL_DECODE_ONLY stay."""
    def hybrid(mode: str, max_len: int) -> int:
        return 64

    full = resolve_config(EngineConfig("m", cudagraph_mode="FULL"), 4096, H200, hybrid)
    assert full.compilation.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert "setting cudagraph_mode=FULL_AND_PIECEWISE" in caplog.text
    assert resolve_config(EngineConfig("m", cudagraph_mode="FULL"), 4096,
                          H200).compilation.cudagraph_mode == "FULL"
    for mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"):
        assert resolve_config(EngineConfig("m", cudagraph_mode=mode), 4096, H200,
                              hybrid).compilation.cudagraph_mode == mode


def test_resolve_pooling():
    r = resolve_config(EngineConfig("m", runner="pooling"), 4096, H200)
    assert r.runner_type == "pooling" and not r.scheduler.async_scheduling
    assert not r.cache.enable_prefix_caching
    with pytest.raises(UnsupportedError, match="async-scheduling"):
        resolve_config(EngineConfig("m", runner="pooling", async_scheduling=True), 4096, H200)
    with pytest.raises(UnsupportedError, match="attention-only"):
        resolve_config(EngineConfig("m", runner="pooling"), 4096, CPU, lambda m, n: 16)


def test_resolved_config_crosses_the_wire():
    """The ready message carries it (msgpack, engine/serial_utils.py) unchanged."""
    from libvllm.engine.engine_core.engine_core_messages import EngineCoreReady
    from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder

    r = resolve_config(EngineConfig("m", enforce_eager=True), 4096, H200)
    ready = EngineCoreReady("llama", "m", 10, 5, r, 0.0, {}, {}, "float32", [2])
    back = MsgpackDecoder(EngineCoreReady).decode(MsgpackEncoder().encode(ready))
    assert back.config == r and back.max_model_len == 4096 and back.device == "cuda"
