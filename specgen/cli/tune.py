"""`specgen tune`: measure this machine's costs and predict the speedup per k.

Re-measures the verify-cost curve of the target (and the draft step of a draft
model), caches it for run / chat / rewrite / bench, estimates acceptance per
draft position on a few bundled requests, and prints Leviathan's prediction
with the measured, non-constant verify cost.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
from specgen.cli.options import MACHINE, DraftMaxOpt, Told, retold, takes
from specgen.policy.base import expected_tokens, step_rate

KMaxOpt = retold(DraftMaxOpt, "Largest k to consider.", int)


def predicted_rates(alphas: list[float], verify_s: list[float], draft_step_s: float, k_max: int) -> list[dict]:
    """Expected tokens per round and speedup over plain for k = 0 … k_max.

    alphas[i]: acceptance at draft position i given the earlier ones were accepted
    (past the last measured position, the last one holds).
    """
    at = [alphas[min(i, len(alphas) - 1)] if alphas else 0.0 for i in range(k_max)]
    rates = [step_rate(at, k, verify_s, draft_step_s) for k in range(k_max + 1)]  # the cost policy's own model
    return [{"k": k, "tokens_per_round": expected_tokens(at[:k]), "round_s": expected_tokens(at[:k]) / rate,
             "speedup": rate / rates[0]} for k, rate in enumerate(rates)]


@takes("model", "draft", "heads", "lookup", "pair", "requests", "max_tokens", "k_max", *MACHINE, "json_out",
       max_tokens=Told("Tokens per request while estimating.", 48), ctx_size=Told(default=2048))
def tune(
    requests: Annotated[int, typer.Option("--requests", help="Bundled requests used to estimate acceptance.")] = 6,
    k_max: KMaxOpt = 16,
    *, opts, max_tokens, json_out,
) -> None:
    """Measure verify / draft costs (cached), estimate acceptance, predict speedup per k."""
    from specgen.bench.requests import load_requests
    from specgen.engine.costs import cost_profile
    from specgen.decode.generation import Generation
    from specgen.rules.sampling import SamplingParams
    from specgen.errors import SpecgenError
    from specgen.session import open_session

    if k_max < 1 or requests < 1 or max_tokens < 2:
        raise SpecgenError("tune needs -k >= 1, --requests >= 1 and -n >= 2")
    opts = replace(opts, draft_max=k_max, adaptive="fixed")
    con = render.stderr_console()
    loaded = open_session(opts)
    try:
        verify = cost_profile(loaded.target, refresh=True)["verify_s"]
        step = 0.0
        if loaded.draft_engine is not None:
            step = cost_profile(loaded.draft_engine, refresh=True)["verify_s"][1]
        elif loaded.mode == "heads":  # one head's step, timed when they were loaded; k stops at their count
            step, k_max = loaded.heads_step_s, min(k_max, loaded.heads.n_heads)
        reqs = load_requests(None)
        picked = [reqs[int(i * len(reqs) / requests)] for i in range(min(requests, len(reqs)))]
        reached = [0] * k_max
        accepted = [0] * k_max
        for req in picked:
            prompt = loaded.target.tokenize(req.prompt)
            gen = Generation(loaded.target, prompt, loaded.drafter, draft_max=k_max, max_tokens=max_tokens,
                             params=SamplingParams(ignore_eos=True))
            for r in gen:
                for i in range(min(r.accepted + 1, r.drafted)):
                    reached[i] += 1
                    accepted[i] += i < r.accepted
        alphas = [a / n if n else 0.0 for a, n in zip(accepted, reached)]
        table = predicted_rates(alphas, verify, step, k_max)
        best = max(table, key=lambda row: row["speedup"])
        result = {
            "mode": loaded.mode, "threads": loaded.target.n_threads,
            "verify_ms": [round(1000 * v, 3) for v in verify[1:]], "draft_step_ms": 1000 * step,
            "alphas": alphas, "prediction": table, "recommended_k": best["k"],
        }
        if json_out:
            sys.stdout.write(json.dumps(result) + "\n")
            return
        con.print(render.tune_table(loaded.mode, table, alphas, verify))
        con.print(f"recommended fixed k: {best['k']} (predicted {best['speedup']:.2f}x); "
                  "the default --adaptive cost policy chooses k each round from these costs (cached now).")
    finally:
        loaded.close()
