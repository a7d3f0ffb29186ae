"""Drafting with prediction heads: the drafter on a fake engine with fake heads (positions,
k = 0, rollback, a missing hidden row, batching), sampled losslessness by chi-square with a
negative control, the pricing capability, and on the real model: greedy output equals plain,
and the CLI's --heads errors are one line."""

import subprocess

import numpy as np
import pytest
from fakes import FakeEngine, HiddenFakeEngine, chain_heads, chain_table, squared_q
from helpers import error_of, specgen
from scipy.stats import chisquare

from specgen.decode.generation import Generation
from specgen.drafters.base import Want
from specgen.drafters.build import DrafterOptions, build_drafter
from specgen.drafters.heads import HeadsDrafter
from specgen.heads.model import time_heads
from specgen.drafters.model import DraftModel
from specgen.policy.base import FixedK
from specgen.rules.sampling import SamplingParams
from dataclasses import replace

V = 16


class Recording(HeadsDrafter):
    """The heads drafter, keeping each want it was asked (its context's length and last two tokens)."""

    def __init__(self, target, heads):
        super().__init__(target, heads)
        self.asked: list[tuple[int, int, int, int]] = []  # (seq, len(context), context[-2], context[-1])

    def propose(self, wants):
        self.asked += [(w.seq, len(w.context), w.context[-2], w.context[-1]) for w in wants if w.k > 0]
        return super().propose(wants)


def run(target, prompt, drafter, k, n=24, params=SamplingParams(), policy=None):
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=replace(params, ignore_eos=True), policy=policy or FixedK())
    for _ in gen:
        pass
    return gen


def test_heads_read_the_row_that_picked_the_last_token():
    eng = HiddenFakeEngine(chain_table(V))
    heads = chain_heads(V, 4)
    d = Recording(eng, heads)
    gen = run(eng, [5, 9, 3], d, k=4)
    assert gen.tokens == [(4 + i) % V for i in range(24)]  # the chain after 3
    assert d.asked and len(d.asked) == len(heads.begun)
    for (seq, n, before, last), (hidden_tokens, lasts) in zip(d.asked, heads.begun):
        assert lasts == [last]
        assert hidden_tokens == [before]  # hidden_at(seq, n - 2): the row of context[n-2]
    reads = [pos for _, pos in eng.hidden_reads]
    assert reads == [n - 2 for _, n, _, _ in d.asked]
    st = gen.stats
    assert st.accepted == st.drafted > 0  # perfect heads: every drafted token accepted
    assert st.rounds < 24 and st.per_position[0] == 1.0


def test_k_zero_drafts_nothing_and_asks_no_row():
    eng = HiddenFakeEngine(chain_table(V))
    heads = chain_heads(V, 4)
    d = HeadsDrafter(eng, heads)
    eng.sync(0, [1, 2, 3])
    out = d.propose([Want(0, [1, 2, 3, 4], 0)])
    assert out[0].tokens == [] and not heads.begun and not eng.hidden_reads


def test_k_is_capped_at_the_heads():
    eng = HiddenFakeEngine(chain_table(V))
    d = HeadsDrafter(eng, chain_heads(V, 3))
    eng.sync(0, [1, 2, 3])
    out = d.propose([Want(0, [1, 2, 3, 4], 8)])
    assert out[0].tokens == [5, 6, 7] and d.model_max == 3
    assert out[0].steps == 3 and out[0].step_s > 0


def test_after_a_rejection_the_next_round_reads_the_kept_row():
    """Heads 0-1 right, 2-3 wrong: every round rejects at position 2, the target's
    cache drops the tail, and the next round's hidden row is the one kept."""
    eng = HiddenFakeEngine(chain_table(V))
    heads = chain_heads(V, 4)
    heads.tables[2:] = np.roll(heads.tables[2:], 3, axis=2)  # heads 2, 3 predict prev + 4
    d = Recording(eng, heads)
    gen = run(eng, [0, 1, 2], d, k=4)
    assert gen.tokens == [(3 + i) % V for i in range(24)]  # greedy: exactly plain
    assert eng.truncations  # rejected tails were rolled back
    # every round after the first drafted: its row was there, and it was context[-2]
    assert all(hid == [before] for (_, _, before, _), (hid, _) in zip(d.asked, heads.begun))
    assert len(heads.begun) == len(d.asked) == gen.stats.rounds - 1
    assert gen.stats.per_position[:2] == [1.0, 1.0] and gen.stats.per_position[2] == 0.0


def test_a_missing_hidden_row_drafts_nothing():
    eng = HiddenFakeEngine(chain_table(V))
    d = HeadsDrafter(eng, chain_heads(V, 4))
    eng.sync(0, [1, 2, 3])
    eng.truncate(0, 1)  # the rows are gone
    assert d.propose([Want(0, [1, 2, 3, 4], 4)])[0].tokens == []
    assert d.propose([Want(0, [1, 2, 3, 4, 5, 6], 4)])[0].tokens == []  # a context past the cached rows


def test_sequences_go_through_the_heads_as_one_batch():
    eng = HiddenFakeEngine(chain_table(V))
    heads = chain_heads(V, 4)
    d = HeadsDrafter(eng, heads)
    eng.sync_many([(0, [1, 2, 3]), (1, [7, 8])])
    out = d.propose([Want(0, [1, 2, 3, 4], 2), Want(1, [7, 8, 9], 4)])
    assert [o.tokens for o in out] == [[5, 6], [10, 11, 12, 13]]
    assert heads.begun == [([3, 8], [4, 9])]  # one begin over both rows: each context[-2], context[-1]
    assert d.steps == 4  # one step per head, for both sequences


def test_sampled_drafts_carry_q_over_ids():
    rng = np.random.default_rng(0)
    ids = np.array([0, 2, 3, 5, 8, 11])
    heads = chain_heads(V, 3, ids=ids)
    heads.tables = rng.standard_normal(heads.tables.shape).astype(np.float32)
    eng = HiddenFakeEngine(chain_table(V))
    eng.sync(0, [1, 2, 3])
    d = HeadsDrafter(eng, heads)
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    out = d.propose([Want(0, [1, 2, 3, 4], 3, params, np.random.default_rng(1))])[0]
    assert len(out.tokens) == len(out.q) == 3
    for tok, q in zip(out.tokens, out.q):
        assert np.all(np.diff(q.ids) > 0)  # a Support: its ids ascending
        q = q.dense()
        assert len(q) == V and abs(q.sum() - 1) < 1e-9 and q[tok] > 0
        assert q[np.setdiff1d(np.arange(V), ids)].sum() == 0  # zeros outside ids
        assert tok in ids


def test_heads_declare_no_full_vocabulary_picks():
    """The loop charges a sampled full-vocabulary pick per drafted token only where the drafter
    declares one: a draft model, not heads (their picks are over ids, inside their timings)."""
    eng = HiddenFakeEngine(chain_table(V))
    sampled = SamplingParams(temperature=0.8)
    heads = build_drafter(DrafterOptions("heads"), eng, heads=chain_heads(V, 2))
    with_lookup = build_drafter(DrafterOptions("heads", lookup_alongside=True, model_max=8), eng, heads=chain_heads(V, 2))
    assert with_lookup.model_max == 2  # never more than the heads
    model = DraftModel(FakeEngine(chain_table(V)), V, V)
    got = {}
    for name, drafter in (("heads", heads), ("heads+lookup", with_lookup), ("model", model)):
        got[name] = Generation(eng, [1, 2], drafter, draft_max=2, params=sampled).policy.draft_picks
    assert got == {"heads": False, "heads+lookup": False, "model": True}


def test_time_heads_is_a_step_time():
    assert 0 < time_heads(chain_heads(V, 4), V) < 0.1


def test_the_cost_policy_starts_from_the_heads_measured_acceptance(monkeypatch):
    import specgen.engine.costs
    import specgen.policy.cost
    from specgen.policy.cost import HEADS_PRIOR, heads_prior
    from specgen.session import make_policy

    heads = chain_heads(V, 4)
    heads.info = {}  # a file without training figures: the default prior
    assert heads_prior(heads) == HEADS_PRIOR and heads_prior(None) == HEADS_PRIOR
    heads.info = {"heldout": {"top1": [0.31, 0.2, 0.1, 0.05]}}
    assert heads_prior(heads) == (0.31, HEADS_PRIOR[1])
    seen = {}
    monkeypatch.setattr(specgen.engine.costs, "cost_profile", lambda target: {"verify_s": [0.0, 0.01, 0.011]})
    make_policy("cost", 4, FakeEngine(chain_table(V)), heads_step_s=1e-4, heads=heads,
                build=lambda k, costs, priors, **kw: seen.update(costs=costs, priors=priors))
    assert seen["priors"].model == (0.31, HEADS_PRIOR[1])


# -- sampled losslessness ---------------------------------------------------------------
SV, N_HEADS, DRAWS, POSITIONS = 6, 3, 3000, 5
PARAMS = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)


SquaredQ = squared_q(HeadsDrafter)


def _setup(seed=3):
    rng = np.random.default_rng(seed)
    table = (1.5 * rng.standard_normal((SV, SV))).astype(np.float32)
    ids = np.array([0, 1, 2, 4, 5])  # token 3 is never drafted
    heads = chain_heads(SV, N_HEADS, ids=ids)
    heads.tables = (1.5 * rng.standard_normal(heads.tables.shape)).astype(np.float32)
    return table, heads


def _marginals(table, first: int) -> np.ndarray:
    """P(token at generated position i), i = 1 … POSITIONS, given the token at position 0."""
    z = table.astype(np.float64) / PARAMS.temperature
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dist = np.zeros(SV)
    dist[first] = 1.0
    out = []
    for _ in range(POSITIONS):
        dist = dist @ p
        out.append(dist)
    return np.array(out)


def position_pvalues(table, drafter, k: int) -> list[float]:
    """Chi-square p-values of the tokens at generated positions 1 … POSITIONS (DRAWS sampled
    runs on the fake target `table`, conditioned on the commonest first token) against the
    target's own marginals; `drafter(engine)` makes each run's drafter."""
    counts = {}
    for seed in range(DRAWS):
        eng = HiddenFakeEngine(table)
        params = SamplingParams(temperature=PARAMS.temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        gen = run(eng, [0, 1], drafter(eng), k=k, n=POSITIONS + 1, params=params)
        counts.setdefault(gen.tokens[0], []).append(gen.tokens[1:])
    first, rows = max(counts.items(), key=lambda kv: len(kv[1]))
    seen, expected = np.array(rows), _marginals(table, first)
    return [chisquare(np.bincount(seen[:, i], minlength=SV), len(rows) * expected[i] / expected[i].sum())[1]
            for i in range(POSITIONS)]


def _positions(cls):
    table, heads = _setup()
    return position_pvalues(table, lambda eng: cls(eng, heads), N_HEADS)


def test_sampled_heads_emit_the_targets_distribution_at_positions_1_to_5():
    pvalues = _positions(HeadsDrafter)
    assert min(pvalues) > 1e-4, pvalues


def test_chi_square_catches_heads_reporting_the_wrong_q():
    """Negative control: the test above has the power to reject a drafter whose q is not the one it sampled from."""
    pvalues = _positions(SquaredQ)
    assert min(pvalues) < 1e-6, pvalues


# -- the real model ------------------------------------------------------------------------
def output_rows(path, ids) -> np.ndarray:
    """The target's output matrix rows `ids` (Gemma ties it to the token embedding), dequantized
    (through the header walk of specgen.heads.collect: gguf.GGUFReader spends seconds on the vocabulary)."""
    from specgen.heads.collect import output_rows as rows

    return rows(path, np.asarray(ids))


def identity_heads(path, kind: str, n_heads: int = 3, target: str | None = None, n_ids: int = 4096, extra=()):
    """Heads built from the target's own output matrix, no training: head 0 an identity
    residual block (W2 = 0: it reads out the row that picked the last token, so it drafts
    the target's own next token again, poorly but validly), the others small random blocks."""
    from specgen.heads.model import Heads, target_identity

    ids = np.unique(np.concatenate([np.arange(n_ids), np.asarray(list(extra), dtype=np.int64)])).astype(np.int32)
    out = output_rows(path, ids)
    d, r = out.shape[1], 16
    rng = np.random.default_rng(0)
    d_in = d if kind == "medusa" else 2 * d
    w1 = [(0.02 * rng.standard_normal((d_in, r))).astype(np.float32) for _ in range(n_heads)]
    w2 = [np.zeros((r, d), np.float32)] + [(0.02 * rng.standard_normal((r, d))).astype(np.float32)
                                            for _ in range(n_heads - 1)]
    n_vocab = int(gguf_n_vocab(path))
    return Heads(kind, ids, n_vocab, target or target_identity(path), out, w1, [np.zeros(r, np.float32)] * n_heads, w2)


def gguf_n_vocab(path) -> int:
    from specgen.engine.llama import Engine

    with Engine.vocab(path) as e:
        return e.n_vocab


@pytest.fixture(scope="module")
def hidden_target(gemma_path):
    from specgen.engine.llama import Engine

    with Engine(gemma_path, n_ctx=1024, n_threads=2, hidden=True) as e:
        yield e


N_REAL = 32


@pytest.fixture(scope="module")
def plains(hidden_target):
    """The copy-heavy and one open-ended prompt, plain greedy on the target opened with hidden=True."""
    from test_model import PROMPTS, plain_run

    prompts = [hidden_target.tokenize(p) for p in PROMPTS[:2]]
    return [(p, *plain_run(hidden_target, p, n=N_REAL)) for p in prompts]


@pytest.mark.model
def test_hidden_target_decodes_as_a_plain_one(target, plains):
    """hidden=True changes nothing of the text: llama.cpp outputs every row while embeddings are
    on, and the engine must still read each prefill's last row (not its first)."""
    from test_model import assert_equal_or_near_tie, greedy

    for prompt, plain, top2 in plains:
        assert_equal_or_near_tie(plain, top2, greedy(target, prompt, n=N_REAL).tokens)  # batch numerics aside


@pytest.mark.model
@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_heads_greedy_equals_plain(hidden_target, gemma_path, plains, kind):
    from test_model import assert_equal_or_near_tie

    heads = identity_heads(gemma_path, kind, extra=[t for p, pl, _ in plains for t in p + pl])
    drafted = 0
    for prompt, plain, top2 in plains:
        spec = Generation(hidden_target, prompt, HeadsDrafter(hidden_target, heads), draft_max=3, max_tokens=N_REAL,
                          policy=FixedK(), params=SamplingParams(ignore_eos=True))
        rounds = list(spec)
        assert len(spec.tokens) == len(plain)
        assert_equal_or_near_tie(plain, top2, spec.tokens)
        st = spec.stats
        assert st.generated == st.rounds + st.accepted
        assert all(r.drafted > 0 for r in rounds[1:-1])  # every round after the first found its hidden row
        drafted += st.drafted
    assert drafted > 0


@pytest.mark.model
def test_heads_auto_without_a_file_fails_in_one_line(gemma_path, tmp_path):
    res = specgen("run", "-m", str(gemma_path), "--heads", "auto", "-n", "4", "hello",
                  env={"SPECGEN_CACHE": str(tmp_path)}, text=True, stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "no prediction heads" in lines[0] and "specgen heads train -m" in lines[0]


@pytest.mark.model
def test_a_heads_file_for_another_model_fails_in_one_line(gemma_path, tmp_path):
    from specgen.heads.model import save_heads

    path = tmp_path / "other.npz"
    save_heads(identity_heads(gemma_path, "medusa", n_heads=2, target="some-other-model-ft1-000000", n_ids=64), path)
    res = specgen("run", "-m", str(gemma_path), "--heads", str(path), "-n", "4", "hello", text=True,
                  stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "another model" in lines[0], res.stderr
    session_error = error_of(__import__("specgen.session", fromlist=["open_heads"]).open_heads, str(path), gemma_path)
    assert "another model" in session_error


@pytest.mark.model
def test_run_with_heads_drafts_and_reports_them(gemma_path, tmp_path):
    import json

    from specgen.heads.model import save_heads

    path = tmp_path / "gemma.npz"
    save_heads(identity_heads(gemma_path, "hydra", n_heads=3, n_ids=2048), path)
    res = specgen("run", "-m", str(gemma_path), "--heads", str(path), "-k", "3", "-n", "24", "--ignore-eos",
                  "--json", "Once upon a time", text=True, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["mode"] == "heads" and out["generated_tokens"] == 24
    spec = out["spec"]
    assert spec["drafted"] > 0 and len(spec["per_position"]) == 3  # acceptance by head position, as a draft model's


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


@pytest.mark.model
def test_a_session_with_heads_holds_numpys_blas_at_one_thread_until_it_closes(gemma_path, tmp_path):
    """numpy's idle BLAS threads spin beside llama.cpp's after each heads matmul (four times
    slower target passes on 2 cores): a session with heads, from the Python API, where the
    CLI's OPENBLAS_NUM_THREADS cannot help, holds BLAS at one thread; two sessions hold it
    together; the last to close restores the process's setting."""
    from threadpoolctl import threadpool_limits

    from specgen.heads.model import save_heads
    from specgen.session import ModelOptions, open_session

    path = tmp_path / "gemma.npz"
    save_heads(identity_heads(gemma_path, "hydra", n_heads=2, n_ids=64), path)
    with threadpool_limits(limits=2, user_api="blas"):
        if _blas_threads() != {2}:
            pytest.skip("this BLAS cannot run 2 threads")
        opts = ModelOptions(model=str(gemma_path), heads=str(path), threads=2, ctx_size=256)
        with open_session(opts) as first:
            assert first.mode == "heads" and _blas_threads() == {1}
            with open_session(opts):
                assert _blas_threads() == {1}
            assert _blas_threads() == {1}  # the first still drafts
        assert _blas_threads() == {2}
        with open_session(ModelOptions(model=str(gemma_path), threads=2, ctx_size=256)):
            assert _blas_threads() == {2}  # no heads: the process's own setting


@pytest.mark.parametrize("command", ["run", "chat", "rewrite", "serve", "bench", "tune"])
def test_every_command_takes_heads(command):
    from typer.testing import CliRunner

    from specgen.cli import app

    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--heads" in res.output


def test_a_server_drafts_every_sequence_with_one_heads_batch():
    """Concurrent serving: the scheduler's step asks the heads for every sequence's want at once,
    one begin over a (B, n_embd) batch; the text is the sequential text."""
    from specgen.serve.scheduler import Job, Server

    eng = HiddenFakeEngine(chain_table(50), n_batch=64)
    heads = chain_heads(50, 3)
    jobs = [Job(f"r{i}", [i, i + 1, i + 2], max_tokens=12) for i in range(3)]
    out = {r.job.id: r for r in Server(eng, 3, draft_max=3, drafter=HeadsDrafter(eng, heads)).serve(jobs)}
    for i in range(3):
        assert out[f"r{i}"].gen.tokens == [(i + 3 + j) % 50 for j in range(12)]
        assert out[f"r{i}"].gen.stats.accepted > 0
    assert max(len(rows) for rows, _ in heads.begun) == 3  # the three sequences in one batch
