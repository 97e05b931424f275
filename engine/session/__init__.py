"""The engine session: one engine and its front-end state (engine/session/session.py),
and the types and errors of its methods. Front ends (capi/, a Python program) import
this face only; the OpenAI layer is engine/entrypoints/openai/api.py.
"""

from engine.async_llm import RequestStream
from engine.config import EngineConfig
from engine.errors import (
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    OutOfResourcesError,
    UnsupportedError,
    VllmError,
)
from engine.exceptions import EngineDeadError
from engine.load_progress import LoadCancelledError
from engine.pooling_params import PoolingParams
from engine.sampling_params import (
    RepetitionDetectionParams,
    RequestOutputKind,
    SamplingParams,
    check_num_logprob_token_ids,
)
from engine.session.errors import InvalidStateError
from engine.session.model_meta import SessionModelInfo
from engine.session.request_times import RequestTimes
from engine.session.routing import RoutedOutput
from engine.session.session import EngineSession, SubmittedRequest
from engine.structured_output.params import StructuredOutputsParams

__all__ = [
    "EngineConfig", "EngineDeadError", "EngineSession", "InvalidArgumentError",
    "InvalidStateError", "LoadCancelledError", "ModelLoadError", "NotFoundError",
    "OutOfResourcesError", "PoolingParams", "RepetitionDetectionParams", "RequestOutputKind",
    "RequestStream", "RequestTimes", "RoutedOutput", "SamplingParams", "SessionModelInfo",
    "StructuredOutputsParams", "SubmittedRequest", "UnsupportedError", "VllmError",
    "check_num_logprob_token_ids",
]
