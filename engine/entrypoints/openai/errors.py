"""OpenAI error bodies: exception -> (HTTP status, {"error": {message, type, param, code}}).

Mirrors vllm/entrypoints/serve/exception_handling/{error_response,utils}.py: validation
errors are 400 "BadRequestError" (pydantic's are 400 "Bad Request", their text from
validation_errors.py), an unknown model 404 "NotFoundError", not implemented 501, anything
else 500 "InternalServerError".
engine.errors classes map as their vllm.h status says (OutOfResources and an engine that
is shutting down -> 503).
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus

from pydantic import ValidationError

from libvllm.engine.entrypoints.openai.validation_errors import format_validation_error
from libvllm.engine.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfResourcesError,
    UnsupportedError,
    VllmError,
)

logger = logging.getLogger(__name__)

_INVALID_STATE = 12  # VLLM_ERR_INVALID_STATE: e.g. the engine is shutting down


class VLLMValidationError(VllmError):
    """A request validation failure naming the offending parameter (vllm/exceptions.py).
    Not a ValueError, so that pydantic validators raise it unwrapped, as in vLLM."""

    status = InvalidArgumentError.status

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class VLLMNotFoundError(NotFoundError):
    """An unknown model (404), with the parameter named like VLLMValidationError."""

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


def not_supported(field: str) -> VLLMValidationError:
    """The one error for request fields whose engine feature does not exist yet."""
    return VLLMValidationError(
        f"`{field}` is not supported yet by this server.", parameter=field)


def sanitize_message(message: str) -> str:
    """Strip memory addresses, tracebacks and file paths (vLLM's sanitize_message)."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(
        r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def error_response(exc: BaseException) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body for `exc`."""
    param = getattr(exc, "parameter", None)
    if isinstance(exc, ValidationError):
        message, param = format_validation_error(exc)
        status, err_type = HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase
    elif isinstance(exc, NotFoundError):
        message, status, err_type = str(exc), HTTPStatus.NOT_FOUND, "NotFoundError"
    elif isinstance(exc, (VLLMValidationError, InvalidArgumentError, ValueError, TypeError,
                          OverflowError)):
        message, status, err_type = str(exc), HTTPStatus.BAD_REQUEST, "BadRequestError"
    elif isinstance(exc, (UnsupportedError, NotImplementedError)):
        message, status, err_type = str(exc), HTTPStatus.NOT_IMPLEMENTED, "NotImplementedError"
    elif isinstance(exc, OutOfResourcesError) or getattr(exc, "status", None) == _INVALID_STATE:
        message, status = str(exc), HTTPStatus.SERVICE_UNAVAILABLE
        err_type = "ServiceUnavailableError"
    else:
        if not isinstance(exc, VllmError):
            logger.exception("internal error in the OpenAI layer", exc_info=exc)
        message, status, err_type = str(exc), HTTPStatus.INTERNAL_SERVER_ERROR, \
            "InternalServerError"
    if not isinstance(exc, (VLLMValidationError, NotFoundError, ValidationError)):
        param = None
    body = {"error": {"message": sanitize_message(message), "type": err_type,
                      "param": param, "code": int(status)}}
    return int(status), body


def error_json(exc: BaseException) -> tuple[int, str]:
    status, body = error_response(exc)
    return status, json.dumps(body)
