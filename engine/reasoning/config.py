"""The reasoning markers of thinking_token_budget, as vllm/config/reasoning.py
(ReasoningConfig.initialize_token_ids).

start = reasoning_start_str or the reasoning parser's start marker; the forced end =
reasoning_end_str or the parser's end marker (it may carry a transition phrase before it);
the natural end = the parser's end marker, else the forced end. Each is tokenized without
special tokens and may be several tokens. Without a start or an end string (or without a
tokenizer) there are no markers, and a request with a budget is refused. The parser class
is read, not built, so a model whose vocabulary lacks the parser's single-token markers
still starts (its markers tokenize to several tokens).
"""

from __future__ import annotations

import logging

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.reasoning import ReasoningParserManager
from libvllm.engine.sampling_params import ReasoningTokenIds

logger = logging.getLogger(__name__)


def resolve_reasoning_token_ids(config: EngineConfig, tokenizer,
                                vocab_size: int) -> ReasoningTokenIds | None:
    """The markers' ids (None: no markers); ids past the logits' width are refused."""
    start, end, natural_end = config.reasoning_start_str, config.reasoning_end_str, ""
    if config.reasoning_parser:
        parser = ReasoningParserManager.get_reasoning_parser(config.reasoning_parser)
        start = start or getattr(parser, "start_token", "")
        natural_end = getattr(parser, "end_token", "")
        end = end or natural_end
    natural_end = natural_end or end
    if not (start and end):
        if config.reasoning_parser or config.reasoning_start_str or config.reasoning_end_str:
            logger.warning("Auto-initialization of reasoning token IDs failed. Please check "
                           "whether your reasoning parser has implemented the "
                           "`reasoning_start_str` and `reasoning_end_str`.")
        return None
    if tokenizer is None:
        logger.warning("no tokenizer (skip_tokenizer_init): thinking_token_budget is off")
        return None
    ids = tuple(tokenizer.encode(s, add_special_tokens=False) for s in (start, end, natural_end))
    if not all(ids):
        raise InvalidArgumentError(
            "ReasoningConfig: failed to tokenize reasoning strings: reasoning_start_str="
            f"'{config.reasoning_start_str}', reasoning_end_str='{config.reasoning_end_str}'. "
            "Ensure the strings are valid tokens in the model's vocabulary.")
    if any(not 0 <= t < vocab_size for marker in ids for t in marker):
        raise InvalidArgumentError(
            f"ReasoningConfig: the reasoning strings' token ids {list(ids)} are not all below "
            f"the model's vocabulary size {vocab_size}")
    if ids[1][-len(ids[2]):] != ids[2]:
        logger.warning("the forced reasoning end %r does not end with the natural end %r: "
                       "a block ended by the budget never closes", end, natural_end)
    return ids
