"""What every replay mode shares: the virtual clock, the stand-in target, the recordings' requests.

A replayed round's outcome is a function of the context and the draft, so the
target is a stand-in whose rows follow recorded text (`ReplayTarget`), each pass
priced on a verify curve, and specgen's loops read a virtual clock
(`virtual_time`) instead of timing anything.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import specgen.decode.generation as decoding
import specgen.decode.tree as treedecode
from policy import f32_target
from specgen.bench import load_requests
from specgen.drafters.build import DrafterOptions
from specgen.plan import ALONGSIDE_NGRAM_MIN
from specgen.models.cache import cache_dir
from specgen.models.registry import resolve_model
from specgen.policy.base import verify_cost

DEPTH = 8  # a draft model's drafts recorded per position (its ceiling with lookup alongside, as in the loader)
OFFER_MAX = 16  # lookup's offers alongside a draft model reach lookup's own ceiling
DRAFT = "smollm2-135m"  # the translated draft (another vocabulary than the Gemma target's)
# prompt lookup as build_drafter puts it beside a draft model (`DrafterOptions.lookup_alongside`)
ALONGSIDE = DrafterOptions("lookup", ngram_min=ALONGSIDE_NGRAM_MIN)


class Clock:
    """time.perf_counter for specgen.decode.generation: this process's CPU time (the host's work,
    blind to other processes on a shared CPU) plus the virtual target passes. host=False:
    the target passes alone, so a replay is the same to the last digit run after run
    (CPU time still moves with the machine's load by ~1 %, enough to blur a small change)."""

    def __init__(self, host: bool = True) -> None:
        self.offset = 0.0
        self.host = host

    def perf_counter(self) -> float:
        return (time.process_time() if self.host else 0.0) + self.offset


class _Row:
    __slots__ = ("tok",)

    def __init__(self, tok: int) -> None:
        self.tok = tok

    def argmax(self) -> int:
        return self.tok


class ReplayTarget:
    """A stand-in for the target engine whose greedy rows are plain's tokens: the
    row after context position p holds truth[p + 1]. Each decode advances the
    clock by the verify curve's cost of its logit rows."""

    def __init__(self, truth: list[int], curve, clock: Clock, n_ctx: int = 4096) -> None:
        self.truth, self.curve, self.clock, self._cost = truth, curve, clock, verify_cost
        self.n_ctx, self.n_vocab, self.n_batch = n_ctx, 262144, 4096
        self.kv: list[int] = []
        self.trace: list[tuple] = []  # per verify pass: (context position, k, accepted, offered, key)
        self.offer: tuple[int, int] = (0, 0)  # the drafter's last proposal: (length, key)

    def is_eog(self, tok: int) -> bool:  # noqa: ARG002 - end of generation is ignored
        return False

    def kv_tokens(self, seq: int = 0) -> list[int]:  # noqa: ARG002
        return list(self.kv)

    def truncate(self, seq: int, n: int) -> None:  # noqa: ARG002
        del self.kv[n:]

    def decode(self, seq: int, tokens, n_logits: int = 1):  # noqa: ARG002
        base = len(self.kv)
        self.kv.extend(tokens)
        first = base + len(tokens) - n_logits
        if n_logits == len(tokens) and base:  # a verify pass: [last, d1 … dk]
            k, truth = len(tokens) - 1, self.truth
            acc = next((j for j in range(k) if tokens[1 + j] != truth[base + 1 + j]), k)
            self.trace.append((base + 1, k, acc, *self.offer))
        self.clock.offset += self._cost(self.curve, max(n_logits, 1))
        return [_Row(self.truth[p + 1]) for p in range(first, first + n_logits)]

    def sync(self, seq: int, tokens):
        self.kv = []
        return self.decode(seq, tokens, 1)[0]

    # draft trees (`TreeGeneration`): a node's row holds plain's next token when its path
    # from the root is plain's text; any other node is never reached (row -1)
    kv_unified, n_seq_max = True, 64

    def decode_tree(self, seq: int, scratch, last: int, tokens, parents):
        base = len(self.kv)

        def truth(i: int) -> int:  # past plain's end: no token
            return self.truth[i] if i < len(self.truth) else -1

        self.kv.append(last)
        depth, on = [], []  # each node's depth, and whether its path is plain's text
        for t, par in zip(tokens, parents):
            depth.append(1 if par < 0 else depth[par] + 1)
            on.append((par < 0 or on[par]) and t == truth(base + depth[-1]))
        rows = [_Row(truth(base + 1))] + [_Row(truth(base + 1 + d) if o else -1) for d, o in zip(depth, on)]
        has_child = set(parents)
        leaves = [i for i in range(len(tokens)) if i not in has_child]
        ids = [seq, *scratch][: max(len(leaves), 1)]
        self._paths = {ids[j]: [tokens[node] for node in _path(parents, leaf)] for j, leaf in enumerate(leaves)}
        acc = max((d for d, o in zip(depth, on) if o), default=0)
        self.trace.append((base + 1, len(tokens), acc, *self.offer))
        self.clock.offset += self._cost(self.curve, len(tokens) + 1)
        return rows, ids

    def keep_path(self, seq: int, scratch, via: int, root: int, n_accepted: int) -> None:  # noqa: ARG002
        self.kv = self.kv[: root + 1] + self._paths[via][:n_accepted]


def _path(parents, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@contextmanager
def virtual_time(clock: Clock):
    """specgen's loops (the chain and the tree one) read `clock` as their time.perf_counter."""
    real = decoding.time
    decoding.time = treedecode.time = clock
    try:
        yield clock
    finally:
        decoding.time = treedecode.time = real


def bundled_subset(per_category: int, categories: set[str] | None = None):
    """The first `per_category` requests of each category of the bundled set (raw-text ones),
    in the set's order; `categories`: only those (None or empty: all)."""
    out, count = [], {}
    for r in load_requests(None):
        if r.prompt and (not categories or r.category in categories) and count.get(r.category, 0) < per_category:
            count[r.category] = count.get(r.category, 0) + 1
            out.append(r)
    return out


def target_path(f32: bool) -> Path:
    """The embedded Gemma 3 270M, or (f32) its all-F32 copy (made once, in specgen's cache)."""
    return f32_target() if f32 else resolve_model("gemma3-270m")


def load_curve(path: Path, rows: int) -> list[float]:
    """A verify curve saved as JSON (seconds of a pass of n logit rows at index n, index 0
    unused), at least `rows` rows long: a replay priced on it, not on the cached profile
    (which every session's passes move); SystemExit in one line if it is not one."""
    try:
        curve = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"replay: cannot read the curve {path}: {err}") from None
    if (not isinstance(curve, list) or len(curve) <= rows
            or not all(isinstance(x, (int, float)) and x > 0 for x in curve[1:])):
        raise SystemExit(f"replay: {path} is not a verify curve of {rows} rows (a JSON list, index 0 unused, "
                         "each pass's seconds > 0)")
    return [0.0] + [float(x) for x in curve[1:]]


def save_curve(path: Path, curve) -> None:
    """Write the verify curve a replay priced on (JSON), whole or not at all; SystemExit in
    one line if it cannot be written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(list(curve)))
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"replay: cannot write the curve {path}: {err}") from None


def recordings() -> Path:
    """Where the policy and translate modes cache their recordings (next to the cost profiles)."""
    store = cache_dir() / "replay"
    store.mkdir(parents=True, exist_ok=True)
    return store
