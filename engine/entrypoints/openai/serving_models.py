"""GET /v1/models: the one served model.

Mirrors vllm/entrypoints/openai/models/serving.py::show_available_models (a ModelCard with
max_model_len and one ModelPermission). `root` is the model file's name, not its path, so
the listing does not disclose the server's directory layout.
"""

from __future__ import annotations

import os

from libvllm.engine.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext


def show_available_models(ctx: ServingContext) -> str:
    root = os.path.basename(ctx.client.engine.config.model)  # fixed: no engine lock
    card = ModelCard(id=ctx.served_model_name, max_model_len=ctx.max_model_len, root=root,
                     permission=[ModelPermission()])
    return ModelList(data=[card]).model_dump_json()
