"""The engine-core client for a config's mode (vLLM's EngineCoreClient.make_client in
vllm/v1/engine/core_client.py): a child-process core (SyncMPClient) with the front end's
own tokenizer, or the core in this process (InprocClient) sharing the core's tokenizer.
The mode is engine/engine_core/core_client.py's use_multiprocessing. The front end of a
child core imports no torch: the in-process core is imported only when chosen.
"""

from __future__ import annotations

from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.core_client import (
    EngineCoreClient,
    InprocClient,
    use_multiprocessing,
)
from libvllm.engine.tokenizer import Tokenizer


def make_client(config: EngineConfig) -> tuple[EngineCoreClient, Tokenizer | None]:
    """The client for config's mode, and the front end's tokenizer."""
    if use_multiprocessing(config):
        from libvllm.engine.engine_core.core_client_mp import SyncMPClient
        from libvllm.engine.model_source import load_tokenizer

        client = SyncMPClient(config)
        try:
            # a GGUF's tokenizer from the key/values the core read: no second open
            metadata = client.ready.gguf_metadata
            return client, load_tokenizer(config, metadata)
        except BaseException:
            client.shutdown()
            raise
    from libvllm.engine.engine_core.engine_core import EngineCore

    core, tokenizer = EngineCore.from_config(config)
    return InprocClient(core), tokenizer
