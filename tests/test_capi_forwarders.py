"""capi/forwarders.py: while the Python runtime cannot be loaded, every forwarder of
libvllm.so's loader still keeps vllm.h's promise that out-parameters are NULL / 0 after a
failure (vllm.h's conventions), so a caller that frees them frees nothing."""

import re

from libvllm.capi.forwarders import forwarders_source


def _not_loaded_branch(source: str, name: str) -> str:
    body = re.search(rf"VLLM_API \S+ {name}\(.*?\n}}\n", source, re.S).group(0)
    return body.split("return not_loaded", 1)[0]


def test_out_parameters_cleared_before_the_not_loaded_status():
    src = forwarders_source()
    create = _not_loaded_branch(src, "vllm_engine_create")
    assert "if (a2 != NULL) *a2 = NULL;" in create  # vllm_engine **out
    embed = _not_loaded_branch(src, "vllm_embed")
    assert "if (a9 != NULL) *a9 = 0;" in embed and "if (a10 != NULL) *a10 = 0;" in embed
    apply = _not_loaded_branch(src, "vllm_chat_template_apply")
    assert "if (a3 != NULL) *a3 = NULL;" in apply  # char **out


def test_input_arrays_are_left_alone():
    embed = _not_loaded_branch(forwarders_source(), "vllm_embed")
    # texts, text_lens, token_ids, n_token_ids (const) and the float buffer are inputs
    assert not re.search(r"\*a[1-4] = |\*a7 = ", embed)
