"""Draft trees: acceptance (greedy: the longest path plain greedy follows; sampled:
exactly the target's distribution), sizing, the suffix index's branches, and
one-pass verification on the real model (rows as if each branch ran alone;
greedy output equal to plain, by the near-tie rule of test_model)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from specgen.drafters.automaton import SuffixAutomaton
from specgen.drafters.suffix import SuffixDrafter, branch_tree
from specgen.policy.trees import size_tree
from specgen.rules.trees import DraftTree, accept_tree_greedy, accept_tree_sampled, chain
from specgen.rules.sampling import SamplingParams

VOCAB = 5
DRAWS = 60_000

# root → 1 (node 0) → 2 (node 1);  root → 3 (node 2) → 4 (node 3), → 0 (node 4)
TREE = DraftTree([1, 2, 3, 4, 0], [-1, 0, -1, 2, 2])


def test_greedy_follows_the_branch_the_target_takes():
    # rows: root, node0 … node4 (argmax per row)
    assert accept_tree_greedy(TREE, [3, 9, 9, 0, 9, 9]) == ([2, 4], 9)  # root→3, node2→0, then 9
    assert accept_tree_greedy(TREE, [1, 2, 7, 9, 9, 9]) == ([0, 1], 7)  # the main branch, all, bonus 7
    assert accept_tree_greedy(TREE, [4, 9, 9, 9, 9, 9]) == ([], 4)  # no child matches


def test_greedy_on_a_chain_is_the_single_draft_rule():
    from specgen.rules.acceptance import accept_greedy

    rng = np.random.default_rng(1)
    for _ in range(200):
        d = list(rng.integers(0, 3, size=4))
        t = list(rng.integers(0, 3, size=5))
        path, nxt = accept_tree_greedy(chain(d), t)
        assert (len(path), nxt) == accept_greedy(d, t)


def test_tree_helpers_and_validation():
    assert TREE.children() == [[0, 2], [1], [], [3, 4], [], []]
    assert TREE.depths() == [1, 2, 1, 2, 2]
    assert TREE.leaves() == [1, 3, 4]
    assert TREE.path(4) == [2, 4]
    sub = TREE.keep([0, 2, 4])
    assert (sub.tokens, sub.parents) == ([1, 3, 0], [-1, -1, 1])
    with pytest.raises(ValueError):
        TREE.keep([1])
    with pytest.raises(ValueError):
        DraftTree([1, 1], [-1, -1]).validate()  # siblings must differ
    TREE.validate()


def _dists(seed):
    rng = np.random.default_rng(seed)
    return [rng.dirichlet(np.full(VOCAB, 0.8)) for _ in range(len(TREE) + 1)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_tree_acceptance_is_lossless(seed):
    """First emitted token ~ p[root]; after a first token that is a child's, the second
    emitted token ~ that child's row (what the target would sample next)."""
    p = _dists(seed)
    p[0][1] = max(p[0][1], 0.3)  # make the branches matter
    p[0] /= p[0].sum()
    rng = np.random.default_rng(100 + seed)
    firsts = np.empty(DRAWS, dtype=np.int64)
    seconds = {0: [], 2: []}
    for t in range(DRAWS):
        path, nxt = accept_tree_sampled(TREE, p, rng)
        emitted = [TREE.tokens[i] for i in path] + [nxt]
        firsts[t] = emitted[0]
        if path:
            seconds[path[0]].append(emitted[1])
    counts = np.bincount(firsts, minlength=VOCAB)
    assert chisquare(counts, p[0] * DRAWS).pvalue > 1e-3
    for node, seen in seconds.items():
        c = np.bincount(np.array(seen, dtype=np.int64), minlength=VOCAB)
        assert chisquare(c, p[node + 1] * len(seen)).pvalue > 1e-3


@pytest.mark.parametrize("seed", range(12))
def test_sampled_tree_follows_the_targets_own_draws(seed):
    """One uniform per emitted token, as plain sampling draws it (`sample`): the
    emitted tokens are what plain sampling would emit along them, and only they
    are drawn."""
    from specgen.rules.sampling import sample

    p = _dists(seed)
    drawn = []

    class Counting:
        def __init__(self):
            self.rng = np.random.default_rng(seed)

        def random(self):
            drawn.append(self.rng.random())
            return drawn[-1]

    path, nxt = accept_tree_sampled(TREE, p, Counting())
    emitted = [TREE.tokens[i] for i in path] + [nxt]
    assert len(drawn) == len(emitted)
    rows = [0] + [i + 1 for i in path]  # the row each emitted token was drawn from
    plain = np.random.default_rng(seed)
    assert emitted == [sample(p[r], plain) for r in rows]


def test_sampled_siblings_raise_acceptance():
    """Two children at the root accept more often than the first alone (the point of a tree)."""
    p = _dists(7)
    rng = np.random.default_rng(3)
    single = chain([TREE.tokens[0]])
    both = TREE.keep([0, 2])
    a = sum(bool(accept_tree_sampled(single, p, rng)[0]) for _ in range(20_000))
    b = sum(bool(accept_tree_sampled(both, p, rng)[0]) for _ in range(20_000))
    expected_a, expected_b = p[0][1], p[0][1] + p[0][3]
    assert abs(a / 20_000 - expected_a) < 0.02 and abs(b / 20_000 - expected_b) < 0.02


def test_sizing_keeps_rows_that_pay_and_respects_width():
    tree = DraftTree([1, 2, 3, 4, 0], [-1, 0, -1, 2, 2], [0.6, 0.5, 0.3, 0.2, 0.05])
    flat = [0.0] + [1.0] * 16  # extra rows free: every node with any reach pays
    assert len(size_tree(tree, [0.6, 0.4], flat, width=8)) == 5
    assert len(size_tree(tree, [0.6, 0.4], flat, width=2)) == 4  # node 4 would be a third leaf
    steep = [0.0] + [1.0 + r for r in range(16)]  # a row costs a whole pass: no extra node pays
    assert size_tree(tree, [0.6, 0.4], steep, width=8).tokens == [1, 2]
    assert len(size_tree(tree, [], flat, width=8)) == 0  # k = 0 stays a plain step


def test_branch_tree_from_the_suffix_index():
    # "5 6 7 ... 5 6 8 ... 5 6 7 ... 5 6": the match "5 6" continued by 7 (twice) or 8 (once)
    toks = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7, 3, 5, 6]
    sam = SuffixAutomaton()
    sam.extend(toks)
    tree = branch_tree(sam, sam.match, sam.after(sam.match_end, 3), 3, 2)
    tree.validate()
    assert tree.tokens[:3] == [7, 3, 5]  # the latest occurrence's continuation
    assert tree.tokens[3:] == [8, 2, 5] and tree.parents[3:] == [-1, 3, 4]
    assert tree.probs[0] == pytest.approx(2 / 3) and tree.probs[3] == pytest.approx(1 / 3)
    d = SuffixDrafter()
    d.cut_at_split = False
    t2 = d.propose_tree(toks, 3, 2)
    assert (t2.tokens, t2.parents) == (tree.tokens, tree.parents)
    assert t2.tokens[:3] == d.propose_one(toks, 3).tokens  # branch 0 is the single-branch draft
    assert len(d.propose_tree(toks, 3, 1)) == 3
    # by default the single-branch draft ends before "5 6 7"'s varying next token
    # (1 once, 3 once): so does branch 0, the alternative at the root stays
    d = SuffixDrafter()
    t3 = d.propose_tree(toks, 3, 2)
    assert d.propose_one(toks, 3).tokens == [7] and t3.tokens[:1] == [7]
    assert t3.tokens[1:] == [8, 2, 5] and t3.parents == [-1, -1, 1, 2]


# -- the real model ------------------------------------------------------------

@pytest.fixture(scope="module")
def unified(gemma_path):
    from specgen.engine.llama import Engine

    with Engine(gemma_path, n_ctx=1024, n_threads=2, n_seq_max=4, kv_unified=True) as e:
        yield e


def _log_softmax(x):
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


@pytest.mark.model
def test_one_pass_rows_equal_each_branch_alone(unified):
    """Every row of the tree pass scores its own path only: as the same path decoded
    alone as a chain on the same cached prefix, up to batch numerics."""
    from test_model import TIE_MARGIN

    e = unified
    prompt = e.tokenize("The colour of the sky is blue. The colour of grass is")
    tree = DraftTree([e.tokenize(" green", add_special=False)[0], 13, 14, 15, 16], [-1, 0, -1, 2, 2])
    base = len(prompt) - 1
    e.sync(0, prompt[:-1])
    rows, ids = e.decode_tree(0, [1, 2, 3], prompt[-1], tree.tokens, tree.parents)
    rows = rows.copy()
    assert ids == [0, 1, 2]  # one sequence per leaf: nodes 1, 3, 4
    assert e.kv_tokens(2) == prompt + [tree.tokens[2], tree.tokens[4]]
    e.keep_path(0, [1, 2, 3], 0, base, 0)
    assert e.kv_tokens(0) == prompt and e.kv_tokens(1) == []
    alone = {}
    for node in range(len(tree)):
        e.truncate(0, base)
        path = [tree.tokens[i] for i in tree.path(node)]
        alone[node] = _log_softmax(e.decode(0, [prompt[-1], *path], 1)[0])
    for node in range(len(tree)):
        assert np.abs(_log_softmax(rows[node + 1]) - alone[node]).max() < TIE_MARGIN
    # a control: node 3 (after 14, 15) is not what node 4 (after 14, 16) scores
    assert np.abs(_log_softmax(rows[4]) - alone[4]).max() > np.abs(_log_softmax(rows[4]) - alone[3]).max()


@pytest.mark.model
def test_keep_path_leaves_the_accepted_branch_cached(unified):
    from test_model import TIE_MARGIN

    e = unified
    prompt = e.tokenize("One, two, three, four,")
    tree = DraftTree([5, 6, 7, 8], [-1, 0, -1, 2])
    base = len(prompt) - 1
    e.sync(0, prompt[:-1])
    _, ids = e.decode_tree(0, [1, 2], prompt[-1], tree.tokens, tree.parents)
    e.keep_path(0, [1, 2], ids[1], base, 2)  # accept nodes 2 and 3 (the second leaf's branch)
    assert e.kv_tokens(0) == prompt + [7, 8]
    assert e.kv_tokens(1) == [] and e.kv_tokens(2) == []
    nxt = _log_softmax(e.decode(0, [9], 1)[0])
    e.truncate(0, base)
    ref = _log_softmax(e.decode(0, [prompt[-1], 7, 8, 9], 1)[0])
    assert np.abs(nxt - ref).max() < TIE_MARGIN
    e.truncate(0, 0)


@pytest.mark.model
def test_tree_greedy_equals_plain(unified):
    from specgen.policy.cost import CostAware, Costs
    from specgen.decode.tree import TreeGeneration
    from test_model import PROMPTS, assert_equal_or_near_tie, plain_run

    e = unified
    prompt = e.tokenize(PROMPTS[0] + "    return a + b\n\nprint(plus(1, 2))\n\nRename plus to add:\n\n")
    plain, top2 = plain_run(e, prompt, n=32)
    policy = CostAware(8, Costs([0.0] + [0.02] * 20))  # flat costs: trees get their width
    gen = TreeGeneration(e, prompt, SuffixDrafter(), draft_max=8, max_tokens=32, policy=policy, tree_width=3, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    assert_equal_or_near_tie(plain, top2, gen.tokens)
    st = gen.stats
    assert st.generated == st.rounds + st.accepted
    assert st.accepted > 10
    assert gen.tree_rounds > 0  # several branches verified in one pass, output still plain's
    e.truncate(0, 0)


@pytest.mark.model
def test_tree_sampled_runs_and_keeps_the_cache_consistent(unified):
    from specgen.policy.cost import CostAware, Costs
    from specgen.rules.sampling import SamplingParams
    from specgen.decode.tree import TreeGeneration
    from test_model import PROMPTS

    e = unified
    prompt = e.tokenize(PROMPTS[0])
    gen = TreeGeneration(e, prompt, SuffixDrafter(), draft_max=8, max_tokens=24, params=SamplingParams(ignore_eos=True, temperature=0.8, seed=5),
                         policy=CostAware(8, Costs([0.0] + [0.02] * 20)), tree_width=3)
    for _ in gen:
        pass
    assert len(gen.tokens) == 24
    assert e.kv_tokens(0) == (prompt + gen.tokens)[: len(e.kv_tokens(0))]
    assert len(e.kv_tokens(0)) >= len(prompt) + 24 - 2
    assert e.kv_tokens(1) == [] and e.kv_tokens(2) == []
    e.truncate(0, 0)


def test_tree_generation_refuses_a_split_cache():
    from specgen.errors import SpecgenError
    from specgen.decode.tree import TreeGeneration

    class Split:
        n_ctx, n_seq_max, kv_unified = 512, 1, False

    with pytest.raises(SpecgenError, match="kv_unified"):
        TreeGeneration(Split(), [1, 2, 3], SuffixDrafter(), draft_max=4, tree_width=2)


@pytest.mark.parametrize("kw, message", [
    ({"tree_width": 2}, "needs --suffix"),
    ({"tree_width": 0, "drafter": "suffix"}, ">= 1"),
    ({"tree_width": 2, "drafter": "suffix", "n_seq": 4}, "one sequence"),
])
def test_tree_width_bad_options(kw, message):
    from specgen.errors import SpecgenError
    from specgen.session import ModelOptions

    with pytest.raises(SpecgenError, match=message):
        ModelOptions(**kw).validate()
    ModelOptions(tree_width=3, drafter="suffix").validate()


def test_the_tree_loop_judges_an_offer_it_passes_over_as_the_chain_loop_does():
    """k = 0 on an offered main branch: the policy still hears what the offer would have
    met (`Policy.observe`), as in `plan_step`; without it, a tree run that never branches
    learned less than the chain run it equals and replayed 2 % slower on the agent workload."""
    from fakes import FakeEngine, chain_table
    from specgen.drafters.base import PerSequence
    from specgen.policy.base import FixedK
    from specgen.decode.tree import TreeGeneration

    class PlainRounds(FixedK):  # always passes the offer over
        def __init__(self):
            super().__init__()
            self.seen = []

        def choose(self, key, limit, situation=None):
            return 0

        def observe(self, key, reached, accepted):
            self.seen.append((key, reached, accepted))

    class Scripted(PerSequence):
        trees = True

        def __init__(self, rounds):
            self.rounds = list(rounds)

        def propose_tree(self, context, k, width, seq=0):
            return chain(self.rounds.pop(0)[:k] if self.rounds else [], key=7)

    policy = PlainRounds()
    # prompt [1] -> first token 2; plain rounds then emit 3, 4, 5
    gen = TreeGeneration(FakeEngine(chain_table(20)), [1], Scripted([[3, 4, 9], [9, 5], []]), draft_max=4,
                         max_tokens=4, policy=policy, tree_width=1)
    list(gen)
    assert gen.tokens == [2, 3, 4, 5]
    # [3, 4, 9] against the emitted [3]: matched as far as known; [9, 5] against [4]: rejected at once
    assert policy.seen == [(7, 1, 1), (7, 1, 0)]
