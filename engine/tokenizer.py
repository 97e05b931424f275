"""Re-export of engine.tokenizers.Tokenizer for the modules that import it from here."""

from libvllm.engine.tokenizers import Tokenizer

__all__ = ["Tokenizer"]
