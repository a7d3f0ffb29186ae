"""specgen: speculative generation on GGUF models through llama.cpp."""

__version__ = "0.1.0"
