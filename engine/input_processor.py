"""InputProcessor: prompt and SamplingParams checks and completion in the front end, as
vllm/v1/engine/input_processor.py (process_inputs, _validate_params,
_validate_structured_output, the decoder prompt checks).

Everything a request can be refused for is checked here, in the caller's process, so
add_request fails synchronously even when the engine core runs in a child process: the
core only refuses what it cannot know (a grammar that does not compile).
"""

from __future__ import annotations

from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.engine_core_messages import EngineCoreReady
from libvllm.engine.errors import InvalidArgumentError, OutOfResourcesError
from libvllm.engine.reasoning.config import resolve_reasoning_token_ids
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.structured_output import StructuredOutputsConfig
from libvllm.engine.structured_output.validation import validate_structured_outputs
from libvllm.engine.tokenizer import Tokenizer


class InputProcessor:
    def __init__(self, config: EngineConfig, ready: EngineCoreReady,
                 tokenizer: Tokenizer | None) -> None:
        self.config = config
        self.ready = ready
        self.tokenizer = tokenizer
        self.max_model_len = ready.max_model_len
        self.generation_config = {"eos_token_id": ready.eos_token_ids}  # vLLM's argument
        self.so_config = None if tokenizer is None else StructuredOutputsConfig(
            backend=config.structured_outputs_backend, reasoning_parser=config.reasoning_parser)
        self.reasoning_token_ids = resolve_reasoning_token_ids(config, tokenizer,
                                                               ready.vocab_size)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.tokenizer is None else self.tokenizer.eos_token_id

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            ids = list(prompt)
        elif self.tokenizer is None:
            raise InvalidArgumentError(
                "You cannot pass text prompts when `skip_tokenizer_init=True`")
        else:
            ids = self.tokenizer.encode(prompt)
        self._validate_prompt(ids)
        return ids

    def process_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """A completed clone of params (vLLM's input processor)."""
        sp = params.clone()
        sp.verify(self.ready.vocab_size, self.config.max_logprobs)
        if sp.max_tokens is None:  # up to the context length
            sp.max_tokens = self.max_model_len - prompt_len
            if sp.min_tokens > sp.max_tokens:
                raise InvalidArgumentError(
                    f"min_tokens must be less than or equal to max_tokens={sp.max_tokens}, "
                    f"got {sp.min_tokens}.")
        sp.update_from_generation_config(self.generation_config, self.eos_token_id)
        if self.tokenizer is not None:
            sp.update_from_tokenizer(self.tokenizer)
        sp.update_from_reasoning_config(self.reasoning_token_ids)
        if sp.structured_outputs is not None:  # vLLM's _validate_structured_output
            if self.so_config is None:
                raise InvalidArgumentError("Structured outputs requires a tokenizer so it "
                                           "can't be used with 'skip_tokenizer_init'")
            validate_structured_outputs(sp.structured_outputs, self.so_config)
        return sp

    def check_fits_kv_cache(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        """Refuse a request the KV cache can never hold instead of letting it wait forever
        (the scheduler's own check, done here so it fails add_request in any mode)."""
        bs = self.ready.config.cache.block_size  # resolved (a hybrid model's is raised)
        # the last sampled token is never fed back, so it needs no KV slot
        num_slots = min(prompt_len + max_tokens, self.max_model_len) - 1
        needed = -(-max(num_slots, prompt_len) // bs)
        usable = self.ready.num_gpu_blocks - 1
        if needed > usable:
            raise OutOfResourcesError(
                f"Request {request_id} needs {needed} KV cache blocks ({prompt_len} prompt "
                f"tokens + up to {max_tokens} new) but the KV cache has {usable} blocks of "
                f"{bs} tokens. Lower max_tokens or increase the KV cache memory.")

    def _validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidArgumentError("The decoder prompt cannot be empty")
        vocab = self.ready.vocab_size
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgumentError(f"Token id {bad} is out of vocabulary")
        if len(ids) >= self.max_model_len:
            raise InvalidArgumentError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                f"length of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                f"than the number of text tokens plus the generated tokens.")
