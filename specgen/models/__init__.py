"""Where models come from: the catalog (models.toml), resolution to a checked file (registry), the GGUF header check, the cache directory, the hub, PyPI packages, and the vocabulary check."""
