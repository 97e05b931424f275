"""examples/bench/gguf_parity.py : the probe that measures a GGUF
model on a device against the fp32 CPU engine. On CPU both sides are the same engine, so
the probe must report exact agreement; a wrong alignment of the teacher-forced positions
or of the greedy comparison shows up as less than that. (The CUDA figures are measured on
the device and recorded in docs/BENCHMARKS.md.)"""

from __future__ import annotations

import json

from examples.bench import gguf_parity


def test_probe_reports_exact_agreement_of_an_engine_with_itself(model_path, tmp_path,
                                                                 monkeypatch, capsys):
    """The command line end to end (one run: two engines): the CPU fp32 engine against
    itself agrees exactly on every row, printed and written to gguf_parity.json."""
    monkeypatch.setattr(gguf_parity, "PROMPTS", gguf_parity.PROMPTS[:2])
    monkeypatch.setattr("sys.argv", ["gguf_parity", "--model", model_path, "--device", "cpu",
                                     "--dtype", "float32", "--max-tokens", "6",
                                     "--out", str(tmp_path)])
    gguf_parity.main()
    res = json.loads((tmp_path / "gguf_parity.json").read_text())
    assert (res["device"], res["dtype"], res["max_tokens"]) == ("cpu", "float32", 6)
    assert [r["prompt_tokens"] for r in res["rows"]] == [5, 4]
    for r in res["rows"]:
        assert r["greedy_equal"] and r["first_difference_at"] is None
        assert r["top1_agreement"] == 1.0 and r["max_logprob_diff"] == 0.0
    assert capsys.readouterr().out.count("greedy equal True  first diff None") == 2
