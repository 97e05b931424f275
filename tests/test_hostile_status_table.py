"""examples/server/app.py STATUS_TO_HTTP : every vllm.h error status has
its HTTP status in one table with vLLM's semantics (400/404/413/501/503), and 500 is only
VLLM_ERR_INTERNAL's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("starlette")
sys.path.insert(0, str(ROOT / "examples" / "server"))
from app import STATUS_TO_HTTP  # noqa: E402

sys.path.pop(0)


def _statuses() -> dict[str, int]:
    version = max(ROOT.glob("abi/vllm-*.json"), key=lambda p: tuple(
        int(x) for x in p.stem.split("-")[1].split(".")))
    enums = json.loads(version.read_text())["enums"]
    return {name: value for name, value in enums.items()
            if name.startswith("VLLM_ERR_")}


def test_every_error_status_is_mapped_and_only_internal_is_500():
    statuses = _statuses()
    assert set(statuses.values()) == set(STATUS_TO_HTTP)
    for name, value in statuses.items():
        code, err_type = STATUS_TO_HTTP[value]
        assert (code == 500) == (name == "VLLM_ERR_INTERNAL"), name
        assert code in (400, 404, 413, 500, 501, 503) and err_type, name
    assert STATUS_TO_HTTP[statuses["VLLM_ERR_INVALID_ARGUMENT"]][0] == 400
    assert STATUS_TO_HTTP[statuses["VLLM_ERR_NOT_FOUND"]][0] == 404
    assert STATUS_TO_HTTP[statuses["VLLM_ERR_UNSUPPORTED"]][0] == 501
    assert STATUS_TO_HTTP[statuses["VLLM_ERR_OUT_OF_RESOURCES"]][0] == 503
