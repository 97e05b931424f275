"""capi.logs: routes the engine's Python `logging` records to vllm_log_set's callback.

With a callback set, the "libvllm.engine" and "libvllm.capi" loggers get a handler that hands each
formatted record to glue_log (C calls the callback there, without the GIL) and stop
propagating, at the callback's minimum level. Without one they propagate as usual: an
embedded interpreter has no handlers, so Python's last resort prints warnings and
errors to stderr; a Python host's own logging configuration applies.
"""

from __future__ import annotations

import logging

from _libvllm import lib

from libvllm.capi.plumbing import export

_LOGGERS = ("libvllm.engine", "libvllm.capi")


class _CallbackHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
        except Exception:
            self.handleError(record)
            return
        lib.glue_log(record.levelno, message.encode("utf-8", "replace"))


_handler = _CallbackHandler()


def configure() -> None:
    level = lib.glue_log_level()
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if level < 0:
            logger.removeHandler(_handler)
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
        else:
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
            logger.propagate = False
            logger.setLevel(level)


@export
def glue_log_configure() -> None:
    configure()


configure()
