"""The public Python API at `import specgen` (docs/api.md)."""

import subprocess
import sys

import pytest

import specgen


def test_every_exported_name_resolves_and_nothing_else_does():
    import importlib

    for name in specgen.__all__:
        if name == "__version__":
            assert isinstance(specgen.__version__, str) and specgen.__version__[0].isdigit()
            continue
        home = importlib.import_module(specgen._API[name])
        # the very object its module defines, under its own name (a lazy export of the wrong thing fails)
        assert getattr(specgen, name) is getattr(home, name), name
        assert getattr(getattr(home, name), "__name__", name) == name, name
    with pytest.raises(AttributeError, match="no_such_name"):
        specgen.no_such_name  # noqa: B018


def test_import_specgen_loads_no_model_code():
    """`import specgen` (and the version the CLI prints) must not pull llama.cpp in."""
    code = "import sys, specgen; specgen.__version__; print('llama_cpp' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.model
def test_load_generate_yields_rounds_that_add_up(gemma_path):
    with specgen.load(str(gemma_path), threads=2, ctx_size=512) as s:
        assert s.mode == "lookup" and s.drafter is not None
        gen = s.generate("def add(a, b):\n    return a + b\n\ndef add(a, b):\n", max_tokens=24)
        rounds = list(gen)
        assert [t for r in rounds for t in r.tokens] == gen.tokens
        assert gen.stats.generated == len(gen.tokens) == 24 and gen.stats.rounds == len(rounds)
        assert sum(r.accepted for r in rounds) == gen.stats.accepted
        assert gen.text == s.target.detokenize(gen.tokens)
    with specgen.load(str(gemma_path), no_spec=True, threads=2, ctx_size=512) as plain:
        assert plain.drafter is None
        base = plain.generate([plain.target.tokenize("def add(a, b):\n")[0]], max_tokens=4)
        assert len(list(base)) == base.stats.rounds == 4  # plain: one token a pass


@pytest.mark.model
def test_run_bench_measures_plain_and_each_config(gemma_path):
    seen = []
    result = specgen.run_bench(configs=["lookup:k=4"], model=str(gemma_path), max_tokens=6, limit=2,
                               warmup=False, threads=2, ctx_size=1024, on_record=seen.append)
    assert result.configs == ["plain", "lookup:k=4"]
    assert len(result.records) == 2 and seen == result.records
    for rec in result.records:
        assert {run["config"] for run in rec["runs"]} == {"plain", "lookup:k=4"}
    assert result.summary["lookup:k=4"]["overall"]["requests"] == 2
