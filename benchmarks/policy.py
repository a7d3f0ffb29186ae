"""Does the default cost policy use a draft model where drafting pays, and only there?

Issue 9's goals, measured side by side in one run (interleaved, medians):
  1. F32 target + Q4_0 draft (a pair where drafting pays on a CPU), one bundled
     request per category, greedy and sampled (temperature 0.8): the default
     `cost` policy vs fixed k in {1, 2, 3, 4, 6, 8}, and vs llama.cpp's
     `llama-speculative-simple --spec-type draft-simple` at its best n-max;
  2. the same pair on a prompt of >= 2,000 tokens (drafting must stay on);
  3. Q4_K_M target + Q4_0 draft (drafting cannot pay), open-ended prompts:
     default >= 0.95x plain.
Speeds are decode tok/s as each tool reports it: tokens after the first over
the time after the first. Both tools read the prompt into the draft before the
first token (specgen only when its policy expects drafting to pay that back),
so neither decode speed includes the draft's prompt prefill; the long-prompt
part also reports end-to-end times, where it counts.

    python benchmarks/policy.py --tools /path/to/llama.cpp/build/bin [--n 96] [--repeats 1]

Without --tools, llama.cpp's side is left out. The F32 target and the Q4_0
draft are written once from the embedded model into specgen's cache
(test-drafts/, the same files the test suite uses).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's specgen, never an installed copy

FIXED = [1, 2, 3, 4, 6, 8]
SPEC_TOOL = "llama-speculative-simple"


def f32_target() -> Path:
    """The embedded model all-F32: a costlier target, beside which the Q4_0 draft pays."""
    from specgen.engine.quantize import paying_pair

    return paying_pair()[0]


def q4_0_draft() -> Path:
    """A genuinely different draft sharing the vocabulary: the embedded model requantized to Q4_0."""
    from specgen.engine.quantize import paying_pair

    return paying_pair()[1]


def models():
    """(the embedded Q4_K_M target, its F32 copy, the Q4_0 draft)."""
    from specgen.models.registry import resolve_model

    return resolve_model("gemma3-270m"), f32_target(), q4_0_draft()


def specgen_run(target, draft, prompt, n, k, policy, temp, seed=1, lookup=False):
    """One generation; `lookup`: prompt lookup's proposals alongside the draft
    model's (specgen's default with -d under the cost policy)."""
    from specgen.decode.generation import Generation
    from specgen.drafters.build import DrafterOptions, OpenedDraft, build_drafter
    from specgen.session import make_policy
    from specgen.rules.sampling import SamplingParams

    target.truncate(0, 0)
    draft.truncate(0, 0)
    # as the loader builds it, with lookup: lookup's offers up to k, the model's up to 8
    opts = DrafterOptions("draft", lookup_alongside=lookup, model_max=min(k, 8) if lookup else None)
    drafter = build_drafter(opts, target, OpenedDraft(draft, same_vocab=True, n_shared=target.n_vocab)) if k else None
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=SamplingParams(ignore_eos=True, temperature=temp, seed=seed),
                     policy=make_policy(policy, k, target, draft) if k else None)
    for _ in gen:
        pass
    st = gen.stats
    return {"tps": st.tokens_per_s, "acc": st.acceptance_rate, "k_hist": dict(sorted(st.k_chosen.items())),
            "ttft_s": st.prefill_s, "total_s": st.total_s,
            "draft_prefill_s": st.draft_prefill_s, "drafted_at": st.drafted_at, "accepted_at": st.accepted_at}


def tune_prediction(target, draft, runs_k8) -> float:
    """What `specgen tune` predicts from the same requests: per-position acceptance of
    fixed-k runs, the cached cost profiles, the cost policy's own step_rate."""
    from specgen.engine.costs import cost_profile
    from specgen.policy.base import step_rate

    reached, accepted = [0] * 8, [0] * 8
    for r in runs_k8:
        for i in range(min(8, len(r["accepted_at"]))):
            reached[i] += r["drafted_at"][0] if i == 0 else r["accepted_at"][i - 1]
            accepted[i] += r["accepted_at"][i]
    alphas = [a / n if n else 0.0 for a, n in zip(accepted, reached)]
    verify, step = cost_profile(target)["verify_s"], cost_profile(draft)["verify_s"][1]
    rates = [step_rate(alphas, k, verify, step) for k in range(9)]
    return max(rates) / rates[0]


def llama_spec(tools, target, draft, text, n, k, temp, threads, ctx, seed=1, spec_type="draft-simple"):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text + "\n")  # llama.cpp's -f drops one trailing newline
    args = [str(Path(tools) / SPEC_TOOL), "-m", str(target), "-md", str(draft), "-f", f.name,
            "-n", str(n), "-t", str(threads), "-td", str(threads), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx),
            "--spec-type", spec_type, "--spec-draft-n-max", str(k), "--temp", str(temp), "--seed", str(seed),
            "--ignore-eos"]
    out = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    log = out.stdout + out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    if out.returncode or not m:
        raise RuntimeError(f"llama-speculative-simple failed:\n{log[-2000:]}")
    acc = re.search(r"accept\s*=\s*([\d.]+)%", log)
    enc = re.search(r"encoded\s+(\d+) tokens", log)
    return {"tps": float(m.group(3)), "acc": float(acc.group(1)) / 100 if acc else None,
            "prompt_tokens": int(enc.group(1)) if enc else None}


def same_prompt(res: dict, n_tokens: int) -> dict:
    """llama.cpp must have read the very prompt specgen did (its -f drops one trailing newline)."""
    if res["prompt_tokens"] is not None and res["prompt_tokens"] != n_tokens:
        raise RuntimeError(f"llama.cpp read {res['prompt_tokens']} prompt tokens, specgen {n_tokens}")
    return res


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", help=f"llama.cpp's build/bin, with {SPEC_TOOL} (omit to skip llama.cpp)")
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--long-n", type=int, default=512,
                    help="tokens to generate after the long prompt (the draft's prefill of it must be paid back)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--parts", default="pair,long,nopay")
    ap.add_argument("--temps", default="0,0.8", help="temperatures of the pair part")
    ap.add_argument("--categories", help="comma-separated categories (default: one request of each)")
    ap.add_argument("--fixed", default="1,2,3,4,6,8", help="fixed k values to compare")
    ap.add_argument("--llama-k", default="2,4,8", help="llama.cpp --spec-draft-n-max values")
    ap.add_argument("--llama-with", default="ngram-simple,ngram-mod",
                    help="llama.cpp n-gram types also run ahead of its draft model (--spec-type T,draft-simple), "
                         "at each --llama-k; empty for none")
    ap.add_argument("--requests", type=int, default=1, help="requests per category (ratios are per-category geomeans)")
    args = ap.parse_args()
    if args.tools and not (Path(args.tools) / SPEC_TOOL).is_file():
        sys.exit(f"policy: no {SPEC_TOOL} in {args.tools} (build llama.cpp's tools, or omit --tools)")
    from specgen.bench import load_requests
    from specgen.engine.llama import Engine

    global FIXED
    FIXED = [int(x) for x in args.fixed.split(",")]
    llama_ks = [int(x) for x in args.llama_k.split(",")]
    cats = set(args.categories.split(",")) if args.categories else None
    base, f32, q4 = models()
    reqs, seen = [], {}
    for r in load_requests(None):
        if seen.get(r.category, 0) < args.requests and r.prompt and (cats is None or r.category in cats):
            seen[r.category] = seen.get(r.category, 0) + 1
            reqs.append(r)
    parts = args.parts.split(",")
    kw = dict(n_ctx=args.ctx, n_threads=args.threads)
    report = {}
    with Engine(f32, **kw) as target, Engine(q4, **kw) as draft:
        if "pair" in parts:
            for temp in [float(t) for t in args.temps.split(",")]:
                rows, k8_runs = {}, []
                for r in reqs:
                    prompt = target.tokenize(r.prompt)
                    res = {}
                    for rep in range(args.repeats):
                        order = [("plain", 0, "fixed"), ("default", 16, "cost"), ("cost alone", 8, "cost")] + [
                            (f"k={k}", k, "fixed") for k in FIXED]
                        if rep % 2:
                            order.reverse()
                        for name, k, pol in order:
                            res.setdefault(name, []).append(specgen_run(target, draft, prompt, args.n, k, pol, temp,
                                                                        seed=rep + 1, lookup=name == "default"))
                        if args.tools:
                            for k in llama_ks:
                                for t in ["", *filter(None, args.llama_with.split(","))]:
                                    name = f"llama {t + '+' if t else ''}draft k={k}"
                                    res.setdefault(name, []).append(same_prompt(llama_spec(
                                        args.tools, f32, q4, r.prompt, args.n, k, temp, args.threads, args.ctx,
                                        seed=rep + 1, spec_type=f"{t},draft-simple" if t else "draft-simple"), len(prompt)))
                    k8_runs.extend(res.get(f"k={max(FIXED)}", []))
                    rows[r.id] = {"category": r.category} | {name: {"tps": median([x["tps"] for x in v]),
                                               "acc": median([x["acc"] for x in v if x["acc"] is not None]),
                                               **({"k_hist": v[-1]["k_hist"]} if name == "default" else {})}
                                        for name, v in res.items()}
                    print(json.dumps({"temp": temp, "request": r.id, **rows[r.id]}), flush=True)
                report[f"pair temp={temp}"] = rows
                if temp == 0.0:
                    report["tune"] = {"predicted": tune_prediction(target, draft, k8_runs),
                                      "measured": statistics.geometric_mean(
                                          [r["cost alone"]["tps"] / r["plain"]["tps"] for r in rows.values()])}
        if "long" in parts:
            text = " ".join(r.prompt for r in load_requests(None) if r.prompt)
            while len(target.tokenize(text)) < 2100:
                text += "\n\n" + text
            text = text[: len(text)]
            prompt = target.tokenize(text)[:2100]
            text = target.detokenize(prompt[1:])
            prompt = target.tokenize(text)
            res = {name: specgen_run(target, draft, prompt, args.long_n, k, pol, 0.0, lookup=name == "default")
                   for name, k, pol in [("plain", 0, "fixed"), ("default", 16, "cost"), ("cost alone", 8, "cost"),
                                        ("k=4", 4, "fixed")]}
            if args.tools:
                res["llama k=4"] = same_prompt(llama_spec(args.tools, f32, q4, text, args.long_n, 4, 0.0, args.threads,
                                                          args.ctx), len(prompt))
            report["long"] = {"prompt_tokens": len(prompt), **res}
            print(json.dumps(report["long"]), flush=True)
    if "nopay" in parts:
        with Engine(base, **kw) as target, Engine(q4, **kw) as draft:
            opens = [r for r in load_requests(None) if r.category == "continuation" and r.prompt]
            res = {}
            for r in opens:
                prompt = target.tokenize(r.prompt)
                for name, k, pol in [("plain", 0, "fixed"), ("default", 16, "cost")]:
                    for rep in range(args.repeats):
                        res.setdefault(name, []).append(
                            specgen_run(target, draft, prompt, args.n, k, pol, 0.0, lookup=name == "default")["tps"])
            report["nopay"] = {name: median(v) for name, v in res.items()}
            print(json.dumps(report["nopay"]), flush=True)
    summarize(report)


def _geo(rows: list[dict], name: str) -> float:
    return statistics.geometric_mean([r[name]["tps"] for r in rows])


def summarize(report: dict) -> None:
    """Per category: geometric means over its requests; the best fixed k and
    llama.cpp's best setting are chosen per category (one k for all its requests)."""
    print("\n== summary (ratios; per category, geomeans over its requests) ==")
    for key, rows in report.items():
        if key.startswith("pair"):
            print(f"\n{key}")
            by_cat: dict[str, list[dict]] = {}
            for r in rows.values():
                by_cat.setdefault(r["category"], []).append(r)
            for cat, rs in by_cat.items():
                g = {name: _geo(rs, name) for name in rs[0] if name != "category"}
                best = max((n for n in g if n.startswith("k=")), key=g.__getitem__)
                line = (f"  {cat:12s} ({len(rs)}) plain {g['plain']:.1f} tok/s · default {g['default']:.1f} "
                        f"({g['default'] / g['plain']:.2f}x plain) · cost alone {g['cost alone']:.1f} · best fixed "
                        f"{best} {g[best]:.1f} → default/best {g['default'] / g[best]:.2f}, cost alone/best "
                        f"{g['cost alone'] / g[best]:.2f}")
                for prefix in ("llama draft", "llama n"):
                    llama = [n for n in g if n.startswith(prefix)]
                    if llama:
                        lb = max(llama, key=g.__getitem__)
                        line += f" · {lb} {g[lb]:.1f} → default/that {g['default'] / g[lb]:.2f}"
                print(line)
        elif key == "long":
            r = rows
            line = f"\nlong prompt ({r['prompt_tokens']} tokens): default/plain {r['default']['tps'] / r['plain']['tps']:.2f}, "
            line += (f"default/k=4 {r['default']['tps'] / r['k=4']['tps']:.2f}, cost alone/k=4 "
                     f"{r['cost alone']['tps'] / r['k=4']['tps']:.2f}, k chosen {r['default']['k_hist']}")
            line += (f"; end to end (prefills included) default {r['default']['total_s']:.1f} s, plain "
                     f"{r['plain']['total_s']:.1f} s, k=4 {r['k=4']['total_s']:.1f} s; the draft's prompt prefill "
                     f"{r['default']['draft_prefill_s']:.1f} s")
            if "llama k=4" in r:
                line += f", default/llama k=4 {r['default']['tps'] / r['llama k=4']['tps']:.2f}"
            print(line)
        elif key == "tune":
            print(f"\ntune's prediction (the model alone at its best k, greedy) {rows['predicted']:.2f}x plain; "
                  f"the cost policy with the model alone measured {rows['measured']:.2f}x (geomean over the requests)")
        elif key == "nopay":
            print(f"\nQ4_K_M + Q4_0, open-ended: default/plain {rows['default'] / rows['plain']:.2f}")


if __name__ == "__main__":
    main()
