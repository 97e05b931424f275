"""The engine session: one engine and its front-end state (engine/session/session.py),
and the types and errors of its methods. Front ends (capi/, a Python program) import
this face only; the OpenAI layer is engine/entrypoints/openai/api.py.
"""

from libvllm.engine.async_llm import RequestStream
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import (
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    OutOfResourcesError,
    UnsupportedError,
    VllmError,
)
from libvllm.engine.exceptions import EngineDeadError
from libvllm.engine.load_progress import LoadCancelledError
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.sampling_params import (
    RepetitionDetectionParams,
    RequestOutputKind,
    SamplingParams,
    check_num_logprob_token_ids,
)
from libvllm.engine.session.errors import InvalidStateError
from libvllm.engine.session.model_meta import SessionModelInfo
from libvllm.engine.session.request_times import RequestTimes
from libvllm.engine.session.routing import RoutedOutput
from libvllm.engine.session.session import EngineSession, SubmittedRequest
from libvllm.engine.structured_output.params import StructuredOutputsParams

__all__ = [
    "EngineConfig", "EngineDeadError", "EngineSession", "InvalidArgumentError",
    "InvalidStateError", "LoadCancelledError", "ModelLoadError", "NotFoundError",
    "OutOfResourcesError", "PoolingParams", "RepetitionDetectionParams", "RequestOutputKind",
    "RequestStream", "RequestTimes", "RoutedOutput", "SamplingParams", "SessionModelInfo",
    "StructuredOutputsParams", "SubmittedRequest", "UnsupportedError", "VllmError",
    "check_num_logprob_token_ids",
]
