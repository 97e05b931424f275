"""Serving of the pooling routes: /v1/embeddings, /pooling, /score, /rerank.

Mirrors vllm/entrypoints/pooling/embed/serving.py (one engine request per input, float
or base64 output: float32 bytes in native order, as OpenAI's SDK decodes them),
pooling/serving.py (task embed | token_embed), scoring/serving.py and
scoring/io_processor.py (an embedding model scores a pair by the cosine similarity of its
two embeddings; 1:1, 1:N or N:N inputs; rerank sorts by relevance and keeps top_n) and
vllm/entrypoints/pooling/base/serving.py (request ids `<prefix>-<request_id>`).
"""

from __future__ import annotations

import base64
import secrets

import numpy as np

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.entrypoints.openai.pooling_protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
    PoolingBasicRequest,
    PoolingRequest,
    PoolingResponse,
    PoolingResponseData,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreRequest,
    ScoreResponse,
    ScoreResponseData,
)
from libvllm.engine.entrypoints.openai.protocol import UsageInfo
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext
from libvllm.engine.outputs import PoolingRequestOutput
from libvllm.engine.pooler_config import POOLING_TASKS
from libvllm.engine.pooling_params import PoolingParams


def _prompts(value) -> list[str | list[int]]:
    """The prompts of an `input`: a string, strings, a token-id list or lists of them."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise VLLMValidationError("input cannot be empty", parameter="input")
    if all(isinstance(v, int) for v in value):
        return [list(value)]
    return list(value)


def _token_ids(ctx: ServingContext, request: PoolingBasicRequest,
               prompt: str | list[int]) -> list[int]:
    ids = ctx.tokenizer("text inputs").encode(prompt) if isinstance(prompt, str) \
        else prompt
    return ctx.fit_prompt(ids, request.truncate_prompt_tokens, request.truncation_side)


def encode(ctx: ServingContext, request: PoolingBasicRequest, prompts: list,
           params: PoolingParams, prefix: str) -> list[PoolingRequestOutput]:
    """Run every prompt as one pooling request; their outputs in prompt order."""
    ctx.check_model(request.model)
    ids = [_token_ids(ctx, request, p) for p in prompts]
    salt = secrets.token_hex(4)
    streams = []
    try:
        for i, prompt_ids in enumerate(ids):
            streams.append(ctx.client.add_pooling_request(
                f"{prefix}-{request.request_id}-{i}-{salt}", prompt_ids,
                PoolingParams(params.use_activation, params.dimensions, params.task)))
        outputs = [stream.get(None) for stream in streams]
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    for out in outputs:
        if out.outputs is None:
            raise VLLMValidationError("the request was aborted")
    return outputs


def _encode_vector(data: list, encoding_format: str) -> list | str:
    if encoding_format == "base64":  # vLLM's tensor2base64: float32, native byte order
        return base64.b64encode(np.asarray(data, dtype=np.float32).tobytes()).decode()
    return data


def _usage(outputs: list[PoolingRequestOutput]) -> UsageInfo:
    n = sum(len(o.prompt_token_ids) for o in outputs)
    return UsageInfo(prompt_tokens=n, total_tokens=n)


def create_embedding(ctx: ServingContext, request: EmbeddingRequest) -> str:
    params = PoolingParams(request.use_activation, request.dimensions, "embed")
    outputs = encode(ctx, request, _prompts(request.input), params, "embd")
    data = [EmbeddingResponseData(index=i, embedding=_encode_vector(
        o.outputs.data, request.encoding_format)) for i, o in enumerate(outputs)]
    return EmbeddingResponse(id=f"embd-{request.request_id}", model=ctx.served_model_name,
                             data=data, usage=_usage(outputs)).model_dump_json()


def _pooling_task(ctx: ServingContext, request: PoolingRequest) -> str:
    """vLLM's _verify_pooling_task: /pooling runs the model's pooling_task only."""
    if request.dimensions is not None:
        raise VLLMValidationError("dimensions is currently not supported",
                                  parameter="dimensions")
    model_task = ctx.client.engine.config.resolved_pooler().task
    task = request.task or model_task
    if task != model_task:
        if task not in POOLING_TASKS:
            raise VLLMValidationError(f"Unsupported task: {task!r} Supported tasks: "
                                      f"{list(POOLING_TASKS)}", parameter="task")
        raise VLLMValidationError("Try switching the model's pooling_task via "
                                  f"--pooler-config.task {task}.", parameter="task")
    return task


def create_pooling(ctx: ServingContext, request: PoolingRequest) -> str:
    params = PoolingParams(request.use_activation, None, _pooling_task(ctx, request))
    outputs = encode(ctx, request, _prompts(request.input), params, "pooling")
    data = [PoolingResponseData(index=i, data=_encode_vector(
        o.outputs.data, request.encoding_format)) for i, o in enumerate(outputs)]
    return PoolingResponse(id=f"pool-{request.request_id}", model=ctx.served_model_name,
                           data=data, usage=_usage(outputs)).model_dump_json()


def _scores(ctx: ServingContext, request: PoolingBasicRequest, side_1, side_2,
            prefix: str) -> tuple[list[float], UsageInfo]:
    """Cosine similarity of each pair (1:1, 1:N or N:N), vLLM's _validate_score_input_lens
    and _post_process of an embedding model."""
    data_1 = [side_1] if isinstance(side_1, str) else list(side_1)
    data_2 = [side_2] if isinstance(side_2, str) else list(side_2)
    if len(data_1) > 1 and len(data_1) != len(data_2):
        raise VLLMValidationError("Input lengths must be either 1:1, 1:N or N:N")
    if not data_1:
        raise VLLMValidationError("At least one text element must be given")
    if not data_2:
        raise VLLMValidationError("At least one text_pair element must be given")
    params = PoolingParams(request.use_activation, None, "embed")
    outputs = encode(ctx, request, data_1 + data_2, params, prefix)
    emb_1 = [np.asarray(o.outputs.data, np.float32) for o in outputs[:len(data_1)]]
    emb_2 = [np.asarray(o.outputs.data, np.float32) for o in outputs[len(data_1):]]
    if len(emb_1) == 1:
        emb_1 = emb_1 * len(emb_2)
    scores = [_cosine(a, b) for a, b in zip(emb_1, emb_2)]
    return scores, _usage(outputs)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """torch's F.cosine_similarity (eps 1e-8) of two vectors."""
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-8))


def create_score(ctx: ServingContext, request: ScoreRequest) -> str:
    side_1, side_2 = request.sides()
    scores, usage = _scores(ctx, request, side_1, side_2, "score")
    data = [ScoreResponseData(index=i, score=s) for i, s in enumerate(scores)]
    return ScoreResponse(id=f"score-{request.request_id}", model=ctx.served_model_name,
                         data=data, usage=usage).model_dump_json()


def create_rerank(ctx: ServingContext, request: RerankRequest) -> str:
    documents = [request.documents] if isinstance(request.documents, str) \
        else list(request.documents)
    scores, usage = _scores(ctx, request, request.query, documents, "rerank")
    results = [RerankResult(index=i, document=RerankDocument(text=doc), relevance_score=s)
               for i, (doc, s) in enumerate(zip(documents, scores))]
    results.sort(key=lambda r: r.relevance_score, reverse=True)
    top_n = request.top_n if request.top_n > 0 else len(results)
    return RerankResponse(id=f"rerank-{request.request_id}", model=ctx.served_model_name,
                          usage=RerankUsage(prompt_tokens=usage.prompt_tokens,
                                            total_tokens=usage.total_tokens),
                          results=results[:top_n]).model_dump_json()
