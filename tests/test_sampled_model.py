"""The real model: a seeded sampled run with point-mass drafts emits plain sampled text.

Point-mass drafts (prompt lookup, a translated draft model) are verified by
sample-and-compare: each emitted token is the target's own draw from its row
with one uniform, in output order, as plain sampling draws it. So with the same
seed the speculative run emits the plain run's text, up to batch numerics: a
row computed inside a verify batch differs a little from the same row alone
(test_model), which moves the boundaries of its cumulative distribution; where
the uniform falls that close to a boundary the two runs part (a near-tie).
At the first difference the tests require exactly that: plain's row gives
plain's token and the speculative run's own row gives its token for the same
uniform (the uniform of that position, the seed's i-th draw), and the two
rows' cumulative distributions are within the measured batch discrepancy.
"""

import json

import numpy as np
from fakes import RowRecorder
import pytest
from typer.testing import CliRunner

from specgen.cli import app
from specgen.decode.generation import Generation
from specgen.drafters.lookup import PromptLookup
from specgen.engine.llama import Engine
from specgen.rules.sampling import SamplingParams, probs
from specgen.drafters.translated import TranslatedDraftModel
from test_model import PROMPTS

pytestmark = pytest.mark.model

# Largest batch-vs-alone shift of a row's cumulative distribution seen on this
# model at temperature 0.8 and the default filters (0.076 over 72 rows of
# batches of 8, median 0.012; see test_batched_rows_move_the_cdf_only_a_little),
# with headroom. On the all-F32 copy the same measure is at most 0.001.
TIE_CDF = 0.12
PARAMS = SamplingParams(temperature=0.8)
N = 40


class Rows(RowRecorder):
    """Wraps an engine; remembers the processed distribution of every row read, by position
    (sparse: the ids left by the filters, in id order, and their probabilities)."""

    def __init__(self, engine, params):
        self.engine, self.params = engine, params
        self.at: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _record(self, first_pos, rows):
        for j, row in enumerate(rows):
            p = probs(row, self.params)
            ids = np.flatnonzero(p)
            self.at[first_pos + j] = (ids, p[ids])



def draw(row, u: float) -> int:
    """`sample` on a sparse row with the uniform u."""
    ids, p = row
    c = np.cumsum(p)
    return int(ids[min(np.searchsorted(c, u * c[-1], side="right"), len(ids) - 1)])


def cdf_shift(a, b) -> float:
    """Largest difference between two sparse rows' cumulative distributions (in id order)."""
    ids = np.union1d(a[0], b[0])
    ca, cb = (np.cumsum(_dense(r, ids)) for r in (a, b))
    return float(np.abs(ca - cb).max())


def _dense(row, ids):
    out = np.zeros(len(ids))
    out[np.searchsorted(ids, row[0])] = row[1]
    return out


def assert_equal_or_near_tie(plain, plain_rows, spec, seed, spec_rows=None):
    """spec equals plain, or parts from it at position i only at a near-tie of plain's i-th uniform.

    plain_rows / spec_rows: each run's row for generated position i, by index. Without
    the speculative run's rows (a run through the CLI), its token must lie within
    TIE_CDF of the uniform in plain's row."""
    if plain == spec:
        return
    i = next(j for j, (a, b) in enumerate(zip(plain, spec)) if a != b)
    u = float(np.random.default_rng(seed).random(i + 1)[i])
    mine = plain_rows[i]
    assert draw(mine, u) == plain[i], f"position {i}: plain did not draw its token with its {i}-th uniform"
    if spec_rows is not None:
        theirs = spec_rows[i]
        assert draw(theirs, u) == spec[i], f"position {i}: the speculative run drew {spec[i]} with another uniform"
        shift = cdf_shift(mine, theirs)
        assert shift < TIE_CDF, f"position {i}: the rows' distributions differ by {shift:.3f}, no near-tie"
    else:
        ids, p = mine
        c = np.cumsum(p)
        where = np.flatnonzero(ids == spec[i])
        lo, hi = (c[where[0]] - p[where[0]], c[where[0]]) if len(where) else (None, None)
        v = u * c[-1]
        assert lo is not None, f"position {i}: the speculative token {spec[i]} is outside plain's filtered row"
        gap = max(lo - v, v - hi, 0.0)
        assert gap < TIE_CDF, f"position {i}: the uniform is {gap:.3f} from the speculative token's share"


def recorded(target, prompt, drafter, seed, k):
    rec = Rows(target, PARAMS)
    gen = Generation(rec, prompt, drafter, draft_max=k, max_tokens=N, params=SamplingParams(ignore_eos=True, temperature=0.8, seed=seed))
    for _ in gen:
        pass
    return gen, [rec.at[len(prompt) - 1 + i] for i in range(len(gen.tokens))]


def test_batched_rows_move_the_cdf_only_a_little(target):
    prompt = target.tokenize(PROMPTS[1])
    plain, alone = recorded(target, prompt, None, 1, 0)
    target.truncate(0, len(prompt) - 1)
    rows = target.decode(0, [prompt[-1]] + plain.tokens[:7], 8).copy()
    shifts = []
    for j, row in enumerate(rows):
        p = probs(row, PARAMS)
        ids = np.flatnonzero(p)
        shifts.append(cdf_shift(alone[j], (ids, p[ids])))
    # Whether the first row of a batch matches the single row exactly depends on the
    # CPU's kernels (Intel AMX/AVX-512 builds: bit-identical; AMD AVX2: 0.0115 here):
    # only the bound is a property of specgen's rule.
    assert max(shifts) < TIE_CDF
    target.truncate(0, 0)


@pytest.fixture(scope="module")
def smol(smollm_path):
    with Engine(smollm_path, n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.mark.parametrize("drafter, seed, which", [
    ("lookup", 1, 0), ("lookup", 2, 1), ("translated", 2, 0), ("translated", 1, 1),
])
def test_sampled_point_mass_drafts_emit_plain_sampled_text(target, smol, drafter, seed, which):
    prompt = target.tokenize(PROMPTS[which])
    plain, plain_rows = recorded(target, prompt, None, seed, 0)
    d = PromptLookup() if drafter == "lookup" else TranslatedDraftModel(target, smol)
    spec, spec_rows = recorded(target, prompt, d, seed, 8 if drafter == "lookup" else 4)
    assert len(spec.tokens) == len(plain.tokens) == N
    assert_equal_or_near_tie(plain.tokens, plain_rows, spec.tokens, seed, spec_rows)
    st = spec.stats
    assert st.generated == st.rounds + st.accepted
    if drafter == "translated" or which == 0:  # the translated model always drafts; lookup on copied text
        assert st.drafted > 0 and st.accepted > 0
    target.truncate(0, 0)


def _cli(prompt, *args):
    res = CliRunner().invoke(app, ["run", prompt, "-m", "gemma3-270m", "--raw", "-n", str(N), "--temp", "0.8", "--seed", "3",
                                   "--ignore-eos", "-c", "1024", "-t", "2", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("which, args", [(0, ["--lookup", "-k", "8"]), (1, ["-d", "SMOL", "-k", "4"])])
def test_specgen_run_sampled_text_does_not_depend_on_the_drafter(target, smollm_path, which, args):
    """Copied text (lookup) and free text (the translated draft: rejections, where the
    old accept-then-resample rule drew other uniforms than plain)."""
    plain = _cli(PROMPTS[which], "--no-spec")
    ref, rows = recorded(target, target.tokenize(PROMPTS[which]), None, 3, 0)
    assert plain["tokens"] == ref.tokens  # the CLI's plain run is the loop's
    spec = _cli(PROMPTS[which], *[str(smollm_path) if a == "SMOL" else a for a in args])
    assert spec["spec"]["drafted"] > 0 and spec["spec"]["accepted"] > 0, args
    assert_equal_or_near_tie(plain["tokens"], rows, spec["tokens"], 3)
    target.truncate(0, 0)
