"""The server's start-up log of the model load: one plain line per 10%
("loading model: 10%" ... "loading model: 100%") from vllm_engine_create's progress
callback (include/vllm.h: 0, then per tensor read in this process, then 1 once ready).
vLLM's `vllm serve` shows a tqdm bar over the checkpoint shards
(vllm/model_executor/model_loader/weight_utils.py); a server's log gets lines instead.
"""

from __future__ import annotations

import logging


class LoadProgressLog:
    """progress(fraction) -> logs each 10% step once, from 10%; never aborts the load."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.tenths = 0  # the last step logged

    def __call__(self, fraction: float) -> None:
        tenths = int(min(max(fraction, 0.0), 1.0) * 10 + 1e-4)
        if tenths > self.tenths:
            self.tenths = tenths
            self.logger.info("loading model: %d%%", tenths * 10)
