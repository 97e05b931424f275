"""Re-export of engine.tokenizers.Tokenizer for the modules that import it from here.

_BYTE_CHARS/_byte_level stay until capi/glue.py uses Tokenizer.id_to_bytes."""

from engine.tokenizers import Tokenizer
from engine.tokenizers.gguf_bpe import BYTE_CHARS as _BYTE_CHARS
from engine.tokenizers.gguf_bpe import to_byte_level as _byte_level

__all__ = ["Tokenizer", "_BYTE_CHARS", "_byte_level"]
