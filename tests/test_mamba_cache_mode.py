"""mamba_cache_mode as the resolve step (engine/resolved_config.py) sets it.

Mirrors vLLM 0.33: vllm/engine/arg_utils.py EngineArgs.create_engine_config (a
--mamba-cache-mode the user gives is not passed on to CacheConfig: it logs
_MAMBA_CACHE_MODE_DEPRECATION_MESSAGE and has no effect), vllm/config/cache.py
(CacheConfig.mamba_cache_mode defaults to "none", MambaCacheMode is "align" | "none", which
the argument parser enforces as its choices) and vllm/model_executor/models/config.py
(HybridAttentionMambaModelConfig -> MambaModelConfig.verify_and_update_config: "align"
with prefix caching, else "none"). Every (hybrid, prefix caching, user value) case.
"""

from __future__ import annotations

import logging

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.resolved_config import (
    MAMBA_CACHE_MODE_DEPRECATION_MESSAGE,
    DeviceFacts,
    resolve_config,
)

CPU = DeviceFacts("cpu")


def _hybrid(mode: str, max_len: int) -> int:
    """A hybrid model's block-size hook: the block size tells which mode it was given."""
    return {"align": 32, "none": 64}[mode]


@pytest.mark.parametrize("user", [None, "none", "align"])
@pytest.mark.parametrize("prefix_caching, want", [(True, "align"), (False, "none")])
def test_hybrid_mode_follows_prefix_caching(user, prefix_caching, want, caplog):
    """A hybrid model: "align" with prefix caching, "none" without, whatever the user
    asked; a value the user sets logs vLLM's deprecation warning, an unset one nothing."""
    config = EngineConfig("m", enable_prefix_caching=prefix_caching, mamba_cache_mode=user)
    with caplog.at_level(logging.WARNING, logger="libvllm.engine.resolved_config"):
        cache = resolve_config(config, 4096, CPU, _hybrid).cache
    assert cache.mamba_cache_mode == want
    assert cache.block_size == _hybrid(want, 4096)  # the hook got the derived mode
    warned = [r for r in caplog.records if r.getMessage() == MAMBA_CACHE_MODE_DEPRECATION_MESSAGE]
    assert len(warned) == (user is not None)
    if user is not None:
        assert warned[0].levelno == logging.WARNING


@pytest.mark.parametrize("user", [None, "none", "align"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_attention_only_model_keeps_none(user, prefix_caching, caplog):
    """Not a hybrid: CacheConfig's default "none" stays, even with prefix caching and a
    user's "align"; the user's value still logs the warning."""
    config = EngineConfig("m", enable_prefix_caching=prefix_caching, mamba_cache_mode=user)
    with caplog.at_level(logging.WARNING, logger="libvllm.engine.resolved_config"):
        cache = resolve_config(config, 4096, CPU).cache
    assert cache.mamba_cache_mode == "none" and cache.block_size == 16
    assert any(r.getMessage() == MAMBA_CACHE_MODE_DEPRECATION_MESSAGE
               for r in caplog.records) == (user is not None)


def test_deprecation_message_is_upstreams():
    assert MAMBA_CACHE_MODE_DEPRECATION_MESSAGE == (
        "--mamba-cache-mode is deprecated and will be removed in v0.33.0. It has no "
        "effect: Mamba prefix caching follows --enable-prefix-caching.")


@pytest.mark.parametrize("bad", ["all", "", "ALIGN"])
def test_a_value_outside_the_choices_is_an_error(bad):
    """vLLM's parser takes only MambaCacheMode's values; so does EngineConfig."""
    with pytest.raises(InvalidArgumentError, match="mamba_cache_mode must be none or align"):
        EngineConfig("m", mamba_cache_mode=bad)
