"""Random-weight GGUF files in llama.cpp's quantized layouts, for speed runs only.

    python examples/bench/random_gguf_quant.py OUT.gguf {q4_k_m,q8_0} [--arch ARCH] [--small]

ARCH is `llama` (Llama-3.1-8B shapes, the default) or `qwen35moe` (Qwen3.5-35B-A3B: hybrid
Gated DeltaNet + gated attention every 4th layer, 256 experts, top 8, a shared expert);
--small writes an 8-layer model of the same layout for a quick CPU check.

The tensor types follow llama.cpp's Q4_K_M choice (src/llama-quant.cpp
llama_tensor_get_type): Q4_K for 2-D weights, Q6_K for `output` and for `attn_v` /
`ffn_down` (`ffn_down_exps` / `ffn_down_shexp` in MoE layers) on the "more bits" layers
(use_more_bits), and F32 for what llama.cpp never quantizes (1-D tensors, the MoE router
`ffn_gate_inp`, `ssm_conv1d`, and the one-row shared-expert gate). q8_0 puts Q8_0 on
every quantized tensor. Block bytes are random with small finite scales, so every
dequantized weight is finite; the GDN decay parameters are fixed (A = -1, dt bias 0). The
vocabulary is a byte-level BPE stub. Needs the gguf package (`pip install gguf`).
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
BLOCK = {Q.Q4_K: (256, 144), Q.Q6_K: (256, 210), Q.Q8_0: (32, 34)}  # (elements, bytes)
LLAMA = dict(hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, head_dim=128,
             vocab=128256)
QWEN35MOE = dict(hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256, vocab=248320,
                 experts=256, experts_used=8, expert_ffn=512, shared_ffn=512, conv_kernel=4,
                 key_heads=16, value_heads=32, key_dim=128, value_dim=128, interval=4)


class RandomBlocks:
    """Random quantized rows, cut from one pool per type (sized for the largest tensor)."""

    def __init__(self, max_elements: int) -> None:
        self.rng = np.random.default_rng(0)
        self.max_elements = max_elements
        self.pools: dict[int, np.ndarray] = {}

    def _pool(self, qt) -> np.ndarray:
        qk, nb = BLOCK[qt]
        nblk = self.max_elements // qk
        p = self.rng.integers(0, 256, size=(nblk, nb), dtype=np.uint8)
        d = np.full(nblk, 0.0005, dtype=np.float16).view(np.uint8).reshape(nblk, 2)
        if qt == Q.Q4_K:
            p[:, 0:2] = d  # d
            p[:, 2:4] = d  # dmin
        elif qt == Q.Q6_K:
            p[:, 208:210] = d
            p[:, 192:208] = self.rng.integers(1, 32, size=(nblk, 16), dtype=np.uint8)
        else:
            p[:, 0:2] = d
        return p.reshape(-1)

    def rows(self, shape: tuple[int, ...], qt) -> np.ndarray:
        """uint8 blocks of a tensor of `shape` (numpy order, last dim contiguous)."""
        qk, nb = BLOCK[qt]
        if qt not in self.pools:
            self.pools[qt] = self._pool(qt)
        n = int(np.prod(shape))
        return self.pools[qt][:n // qk * nb].reshape(*shape[:-1], shape[-1] // qk * nb)


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def add_vocab(w: gguf.GGUFWriter, vocab: int) -> None:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    toks = ["<|begin_of_text|>", "<|end_of_text|>"] + [chr(c) for c in cs] + \
        ["Ġt", "Ġa", "he", "in"]
    toks += [f"<tok{i}>" for i in range(vocab - len(toks))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (vocab - 2))
    w.add_token_merges(["Ġ t", "Ġ a", "h e", "i n"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


class Writer:
    """Adds tensors to a GGUFWriter: quantized ones as random blocks, F32 ones given."""

    def __init__(self, w: gguf.GGUFWriter, kind: str, max_elements: int) -> None:
        self.w, self.kind = w, kind
        self.blocks = RandomBlocks(max_elements)
        self.base = Q.Q4_K if kind == "q4_k_m" else Q.Q8_0

    def quant(self, name: str, *shape: int, high: bool = False) -> None:
        qt = Q.Q6_K if high and self.kind == "q4_k_m" else self.base
        self.w.add_tensor(name, self.blocks.rows(shape, qt), raw_dtype=qt)

    def f32(self, name: str, value: np.ndarray) -> None:
        self.w.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))


def write_llama(out: str, kind: str, small: bool) -> None:
    c = dict(LLAMA, hidden=512, ffn=1024, layers=8, heads=4, kv_heads=2, vocab=16384) \
        if small else LLAMA
    d, n, hd = c["hidden"], c["layers"], c["head_dim"]
    g = gguf.GGUFWriter(out, "llama")
    g.add_context_length(8192)
    g.add_embedding_length(d)
    g.add_block_count(n)
    g.add_feed_forward_length(c["ffn"])
    g.add_head_count(c["heads"])
    g.add_head_count_kv(c["kv_heads"])
    g.add_rope_freq_base(500000.0)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_rope_dimension_count(hd)
    g.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if kind == "q4_k_m"
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_vocab(g, c["vocab"])
    w = Writer(g, kind, c["vocab"] * d)
    ones = np.ones(d)
    w.quant("token_embd.weight", c["vocab"], d)
    for i in range(n):
        p, hi = f"blk.{i}.", more_bits(i, n)
        w.f32(p + "attn_norm.weight", ones)
        w.quant(p + "attn_q.weight", c["heads"] * hd, d)
        w.quant(p + "attn_k.weight", c["kv_heads"] * hd, d)
        w.quant(p + "attn_v.weight", c["kv_heads"] * hd, d, high=hi)
        w.quant(p + "attn_output.weight", d, c["heads"] * hd)
        w.f32(p + "ffn_norm.weight", ones)
        w.quant(p + "ffn_gate.weight", c["ffn"], d)
        w.quant(p + "ffn_up.weight", c["ffn"], d)
        w.quant(p + "ffn_down.weight", d, c["ffn"], high=hi)
    w.f32("output_norm.weight", ones)
    w.quant("output.weight", c["vocab"], d, high=True)
    finish(g)


def write_qwen35moe(out: str, kind: str, small: bool) -> None:
    c = dict(QWEN35MOE, hidden=256, layers=8, vocab=16384, experts=16) if small else QWEN35MOE
    d, n, hd, e = c["hidden"], c["layers"], c["head_dim"], c["experts"]
    hk, hv, dk, dv = c["key_heads"], c["value_heads"], c["key_dim"], c["value_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    g = gguf.GGUFWriter(out, "qwen35moe")
    a = "qwen35moe."
    for key, v in [("block_count", n), ("context_length", 262144), ("embedding_length", d),
                   ("feed_forward_length", 0), ("attention.head_count", c["heads"]),
                   ("attention.head_count_kv", c["kv_heads"]), ("attention.key_length", hd),
                   ("attention.value_length", hd), ("rope.dimension_count", hd // 4),
                   ("ssm.conv_kernel", c["conv_kernel"]), ("ssm.state_size", dk),
                   ("ssm.group_count", hk), ("ssm.time_step_rank", hv),
                   ("ssm.inner_size", hv * dv), ("full_attention_interval", c["interval"]),
                   ("nextn_predict_layers", 0), ("expert_count", e),
                   ("expert_used_count", c["experts_used"]),
                   ("expert_feed_forward_length", c["expert_ffn"]),
                   ("expert_shared_feed_forward_length", c["shared_ffn"])]:
        g.add_uint32(a + key, v)
    g.add_array(a + "rope.dimension_sections", [11, 11, 10, 0])
    g.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    g.add_float32(a + "rope.freq_base", 1e7)
    g.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if kind == "q4_k_m"
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_vocab(g, c["vocab"])
    w = Writer(g, kind, max(c["vocab"] * d, e * c["expert_ffn"] * d))
    rng = np.random.default_rng(1)
    small_rand = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.02  # noqa: E731
    ones = np.ones(d)
    w.quant("token_embd.weight", c["vocab"], d)
    for i in range(n):
        p, hi = f"blk.{i}.", more_bits(i, n)
        w.f32(p + "attn_norm.weight", ones)  # stored as w + 1 (zero-centred norms)
        w.f32(p + "post_attention_norm.weight", ones)
        if i % c["interval"] == c["interval"] - 1:  # gated full attention
            w.quant(p + "attn_q.weight", 2 * c["heads"] * hd, d)
            w.quant(p + "attn_k.weight", c["kv_heads"] * hd, d)
            w.quant(p + "attn_v.weight", c["kv_heads"] * hd, d, high=hi)
            w.quant(p + "attn_output.weight", d, c["heads"] * hd)
            w.f32(p + "attn_q_norm.weight", np.ones(hd))
            w.f32(p + "attn_k_norm.weight", np.ones(hd))
        else:  # Gated DeltaNet
            w.quant(p + "attn_qkv.weight", conv_dim, d)
            w.quant(p + "attn_gate.weight", hv * dv, d)
            w.quant(p + "ssm_beta.weight", hv, d)
            w.quant(p + "ssm_alpha.weight", hv, d)
            w.f32(p + "ssm_conv1d.weight", small_rand(conv_dim, c["conv_kernel"]))
            w.f32(p + "ssm_a", -np.ones(hv))  # -exp(A_log), A_log = 0
            w.f32(p + "ssm_dt.bias", np.zeros(hv))
            w.f32(p + "ssm_norm.weight", np.ones(dv))
            w.quant(p + "ssm_out.weight", d, hv * dv)
        w.f32(p + "ffn_gate_inp.weight", small_rand(e, d))
        w.f32(p + "ffn_gate_inp_shexp.weight", small_rand(d))
        w.quant(p + "ffn_gate_exps.weight", e, c["expert_ffn"], d)
        w.quant(p + "ffn_up_exps.weight", e, c["expert_ffn"], d)
        w.quant(p + "ffn_down_exps.weight", e, d, c["expert_ffn"], high=hi)
        w.quant(p + "ffn_gate_shexp.weight", c["shared_ffn"], d)
        w.quant(p + "ffn_up_shexp.weight", c["shared_ffn"], d)
        w.quant(p + "ffn_down_shexp.weight", d, c["shared_ffn"], high=hi)
    w.f32("output_norm.weight", ones)
    w.quant("output.weight", c["vocab"], d, high=True)
    finish(g)


def finish(g: gguf.GGUFWriter) -> None:
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file(progress=False)
    g.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("kind", choices=["q4_k_m", "q8_0"])
    ap.add_argument("--arch", choices=["llama", "qwen35moe"], default="llama")
    ap.add_argument("--small", action="store_true", help="an 8-layer model, same layout")
    args = ap.parse_args()
    t0 = time.time()
    (write_llama if args.arch == "llama" else write_qwen35moe)(args.out, args.kind,
                                                                args.small)
    print(f"wrote {args.out} ({args.arch}, {args.kind}) in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
