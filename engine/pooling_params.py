"""PoolingParams: the per-request parameters of a pooling request, as vllm/pooling_params.py.

task "embed" (one vector per prompt, the seq pooler) or "token_embed" (one vector per
prompt token, the tok pooler ALL); use_activation (None: the pooler config's, else True:
L2 normalization for embeddings) and `dimensions` (matryoshka truncation, refused with
vLLM's messages on a model that is not matryoshka: a converted decoder is not). verify()
merges the pooler config's defaults (_merge_default_parameters) and checks
(_set_default_parameters, _verify_valid_parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.pooler_config import POOLING_TASKS, PoolerConfig


@dataclass
class PoolingParams:
    use_activation: bool | None = None
    dimensions: int | None = None
    task: str | None = None  # set by the entrypoint (vLLM: internal use)

    def verify(self, pooler: PoolerConfig, model_name: str, embedding_size: int,
               matryoshka_dimensions: list[int] | None = None,
               is_matryoshka: bool = False) -> PoolingParams:
        """A completed copy (vLLM's PoolingParams.verify on a model config)."""
        task = self.task or "embed"
        if task not in POOLING_TASKS:
            raise InvalidArgumentError(f"Unsupported task: {task!r} Supported tasks: "
                                       f"{list(POOLING_TASKS)}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise InvalidArgumentError("use_activation must be a bool")
        dims = self.dimensions if self.dimensions is not None else pooler.dimensions
        use_activation = self.use_activation if self.use_activation is not None \
            else pooler.use_activation
        if use_activation is None:
            use_activation = True
        if dims is not None:
            if isinstance(dims, bool) or not isinstance(dims, int):
                raise InvalidArgumentError(f"dimensions must be an int, got {dims!r}")
            if not is_matryoshka:
                raise InvalidArgumentError(
                    f"Model {model_name!r} does not support Matryoshka embeddings; "
                    f"dimensions must be unset (received dimensions={dims}).")
            if not 1 <= dims <= embedding_size:
                raise InvalidArgumentError(
                    f"Model {model_name!r} only supports dimensions in range "
                    f"[1, {embedding_size}], got {dims}.")
            if matryoshka_dimensions is not None and dims not in matryoshka_dimensions:
                raise InvalidArgumentError(
                    f"Model {model_name!r} only supports Matryoshka dimensions "
                    f"{matryoshka_dimensions}, got {dims}.")
        return PoolingParams(use_activation, dims, task)
