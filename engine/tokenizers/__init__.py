"""Tokenizers: text <-> token ids for a GGUF's vocabulary or a Hugging Face directory.

Mirrors vllm/tokenizers/ (one tokenizer type behind the engine, whatever the model format).
Modules: tokenizer (the Tokenizer class), gguf_metadata (checked tokenizer.* keys, special
tokens), gguf_bpe (byte-level BPE), gguf_spm (SentencePiece), hf (Hugging Face directories).
"""

from libvllm.engine.tokenizers.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
