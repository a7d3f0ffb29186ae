"""Drafting replayed on priced costs: the real loop, no timing noise.

Greedy decoding (and, for point-mass drafts, one seeded sampled run) makes a
round's outcome a function of the context and the draft, so recorded text
can be replayed through specgen's own loop (`Generation`, `plan_step`, the
drafters, the cost policy) on a stand-in target whose rows follow it, each
pass priced on a verify curve instead of timed. The modes:

  suffix     model-free drafting (prompt lookup, the suffix index, draft trees)
             on `benchmarks/suffix.py`'s records, with its hindsight ceilings
  policy     draft-length policies against recorded greedy drafts of a draft
             model (the F32 target with its Q4_0 draft)
  translate  translated drafts (SmolLM2 drafting for Gemma through text) on
             recorded sampled runs
  lookup     the default (prompt lookup, cost policy) on the real pair's 1.5B
             target, Q4_K_M or F16, over recorded chat replies
  model      the pair's 0.5B draft model (-d) on the same target and replies,
             its predictions recorded along the text in one pass

    python benchmarks/replay.py suffix agent-*.json --configs lookup current --no-host
    python benchmarks/replay.py policy --n 96 --seeds 8
    python benchmarks/replay.py translate --f32 --seeds 1,2 --n 48,96 --configs plain,alone,default
    python benchmarks/replay.py lookup --f16 -n 96
    python benchmarks/replay.py model --f16 --configs lookup default k=3

`python benchmarks/replay.py MODE --help` describes each. Recordings of the
policy and translate modes are cached next to the cost profiles
(~/.cache/specgen/replay, or $SPECGEN_CACHE/replay).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's specgen (and benchmarks/), never an installed copy

from replaylib import lookup, model, policy, suffix, translate  # noqa: E402 - the modes, one module each (benchmarks/replaylib/)

# each mode's module: its description (__doc__), its options (options(parser)) and its run (run(args))
MODES = {"suffix": suffix, "policy": policy, "translate": translate, "lookup": lookup, "model": model}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True, metavar="MODE")
    for name, mode in MODES.items():
        text = mode.__doc__
        p = sub.add_parser(name, help=text.strip().splitlines()[0], description=text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mode.options(p)
    args = ap.parse_args(argv)
    MODES[args.mode].run(args)


if __name__ == "__main__":
    main()
