"""Request and response models of the pooling routes: /v1/embeddings, /pooling, /score,
/rerank.

Mirrors vllm/entrypoints/pooling/embed/protocol.py (EmbeddingCompletionRequest,
EmbeddingResponse), pooling/protocol.py (PoolingCompletionRequest, PoolingResponse),
scoring/protocol.py (ScoreRequest's four spellings of the two sides, RerankRequest,
ScoreResponse, RerankResponse) and base/protocol.py (PoolingBasicRequestMixin,
EncodingRequestMixin, the removed `normalize`). Chat-message inputs and multi-modal score
inputs are not implemented; their fields are refused with a 400.
"""

from __future__ import annotations

import time
from typing import Literal, TypeAlias

from pydantic import Field, model_validator

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    OpenAIBaseModel,
    TruncatePromptTokens,
    UsageInfo,
    random_uuid,
)

# token ids are not bounded here: a negative or too large id is refused by the engine
# ("out of vocabulary"), as vLLM's pooling schema leaves it to the engine
PoolingInput: TypeAlias = list[int] | list[list[int]] | str | list[str]


def _reject_removed(data):
    """vLLM's reject_removed_pooling_parameters."""
    if isinstance(data, dict) and "normalize" in data:
        raise VLLMValidationError(
            "Parameter `normalize` was removed; use `use_activation` instead.",
            parameter="normalize")
    if isinstance(data, dict) and "messages" in data:
        raise VLLMValidationError("chat `messages` inputs are not supported yet by this "
                                  "server.", parameter="messages")
    return data


class PoolingBasicRequest(OpenAIBaseModel):
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str = Field(default_factory=random_uuid)
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    use_activation: bool | None = None

    _removed = model_validator(mode="before")(_reject_removed)


class EmbeddingRequest(PoolingBasicRequest):
    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class PoolingRequest(EmbeddingRequest):
    task: str | None = None  # None: the model's pooling_task (--pooler-config's task)


ScoreSide: TypeAlias = str | list[str]


class ScoreRequest(PoolingBasicRequest):
    """One of vLLM's four spellings: queries/documents, queries/items, data_1/data_2,
    text_1/text_2."""

    queries: ScoreSide | None = None
    documents: ScoreSide | None = None
    items: ScoreSide | None = None
    data_1: ScoreSide | None = None
    data_2: ScoreSide | None = None
    text_1: ScoreSide | None = None
    text_2: ScoreSide | None = None

    def sides(self) -> tuple[ScoreSide, ScoreSide]:
        for first, second in (("queries", "documents"), ("queries", "items"),
                              ("data_1", "data_2"), ("text_1", "text_2")):
            a, b = getattr(self, first), getattr(self, second)
            if a is not None and b is not None:
                return a, b
        raise VLLMValidationError("a score request needs queries and documents (or items), "
                                  "data_1 and data_2, or text_1 and text_2")


class RerankRequest(PoolingBasicRequest):
    query: str
    documents: ScoreSide
    top_n: int = Field(default=0, ge=0)


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class _ListResponse(OpenAIBaseModel):
    """The envelope of the embedding, pooling and score responses (each subclass sets its
    id prefix and data items; the fields keep this order)."""

    id: str
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list
    usage: UsageInfo


class EmbeddingResponse(_ListResponse):
    id: str = Field(default_factory=lambda: f"embd-{random_uuid()}")
    model: str | None = None
    data: list[EmbeddingResponseData]


class PoolingResponseData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: list[list[float]] | list[float] | str


class PoolingResponse(_ListResponse):
    id: str = Field(default_factory=lambda: f"pool-{random_uuid()}")
    data: list[PoolingResponseData]


class ScoreResponseData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(_ListResponse):
    id: str = Field(default_factory=lambda: f"embd-{random_uuid()}")
    data: list[ScoreResponseData]


class RerankDocument(OpenAIBaseModel):
    text: str | None = None


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(OpenAIBaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
