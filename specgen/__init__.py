"""specgen: speculative generation on GGUF models through llama.cpp.

The public API (docs/api.md): `load` opens a target with its drafter as a
`Session`; `Session.generate` gives a `Generation` that yields one `Round` per
target pass and keeps `Stats`; `run_bench` runs a request set plain and
speculative, side by side. Names are imported on first use, so `import specgen`
stays cheap.
"""

__version__ = "0.1.0"

_API = {
    "load": "specgen.api", "run_bench": "specgen.api", "BenchResult": "specgen.api",
    "Session": "specgen.session", "ModelOptions": "specgen.session",
    "Generation": "specgen.decode.generation", "Round": "specgen.decode.stats", "Stats": "specgen.decode.stats",
    "SamplingParams": "specgen.rules.sampling", "SpecgenError": "specgen.errors",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'specgen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
