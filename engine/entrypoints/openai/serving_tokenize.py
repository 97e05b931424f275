"""POST /tokenize and POST /detokenize.

Mirrors vllm/entrypoints/serve/tokenize/serving.py: a body with `messages` is rendered with
the chat template first (add_special_tokens defaults to False then, True for `prompt`);
return_token_strs adds the vocab pieces; /detokenize decodes keeping special tokens.
Neither waits for the engine's lock (the tokenizer and the chat template are read-only).
"""

from __future__ import annotations

from typing import Any

from libvllm.engine.entrypoints.openai.chat_render import render_prompt
from libvllm.engine.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext


def create_tokenize(ctx: ServingContext, data: Any) -> str:
    chat = isinstance(data, dict) and "messages" in data
    request = (TokenizeChatRequest if chat else TokenizeCompletionRequest).model_validate(data)
    ctx.check_model(request.model)
    tok = ctx.tokenizer("/tokenize requests")
    text = render_prompt(ctx.client.engine, request) if chat else request.prompt
    ids = tok.encode(text, add_special_tokens=request.add_special_tokens)  # GIL released
    strs = [tok.id_to_piece(t) for t in ids] if request.return_token_strs else None
    return TokenizeResponse(tokens=ids, token_strs=strs, count=len(ids),
                            max_model_len=ctx.max_model_len).model_dump_json()


def create_detokenize(ctx: ServingContext, data: Any) -> str:
    request = DetokenizeRequest.model_validate(data)
    ctx.check_model(request.model)
    tok = ctx.tokenizer("/detokenize requests")
    text = tok.decode(request.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text).model_dump_json()
