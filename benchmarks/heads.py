"""Do prediction heads pay? Heads (cost policy, prompt lookup alongside) against plain decoding,
beside a draft model, in one run.

Targets: the all-F32 copy of the embedded Gemma 3 270M (the pair that pays: its
Q4_0 requantization drafts beside it as the upper reference, draft=Q4_0 with
lookup alongside under the cost policy) and the embedded Q4_K_M itself. Each
target's heads: --heads / --heads-q4km FILE, else those `specgen heads train`
made for it (auto), else trained here for --train-minutes N (none given: that
target is skipped with a note).

Requests: the bundled ones (by category) and open-ended prompts defined here,
which the heads never trained on (their training seeds are their own). Each
target and temperature (greedy and 0.8) is one `specgen bench` run: every
configuration interleaved with plain, --repeats runs each, median latency per
request, speedup = plain ÷ configuration; this script prints the geometric mean
per category and overall, the heads' own share (heads with lookup over lookup alone,
per request), the heads' time per round against a target pass (from
the heads-alone configuration heads:k=K, fixed k, no lookup), and head-1
acceptance per category (the same configuration: acceptance at draft position 1).

  python benchmarks/heads.py --repeats 3 --tokens 96 --threads 2
  python benchmarks/heads.py --temps 0.8 --seeds 6 --repeats 1 --targets f32   # sampled: more texts, fewer repeats
  python benchmarks/heads.py --requests 1 --tokens 8 --repeats 1 --temps 0 --targets q4km   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's specgen, never an installed copy

OPEN_ENDED = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about two friends who get lost on a mountain hike.",
    "Explain how vaccines train the immune system.",
    "Describe a busy market on a rainy morning.",
    "Explain how a bicycle stays upright while moving.",
    "Write a letter from a traveller to their family back home.",
    "Explain how search engines decide which pages to show first.",
]


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def requests_file(n: int, out: Path, categories: set[str] | None = None, seeds: int = 1) -> Path:
    """The first n bundled requests of each category, and n open-ended prompts (category open-ended);
    only `categories` when given; each `seeds` times, with seeds 100, 101, ... (sampled runs: one seed's
    text is one sample, and a request's speedup swings with whether that text repeats itself)."""
    from specgen.bench.requests import bundled_requests_text

    seen: dict[str, int] = {}
    lines = []
    for line in bundled_requests_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        cat = r.get("category", "other")
        if seen.get(cat, 0) < n and (categories is None or cat in categories):
            seen[cat] = seen.get(cat, 0) + 1
            lines.append(json.dumps(r))
    for i, prompt in enumerate(OPEN_ENDED[:n] if categories is None or "open-ended" in categories else []):
        lines.append(json.dumps({"id": f"open-{i}", "category": "open-ended", "prompt": prompt}))
    if seeds > 1:
        lines = [json.dumps({**r, "id": f"{r['id']}-s{s}", "seed": 100 + s}) for r in map(json.loads, lines)
                 for s in range(seeds)]
    out.write_text("\n".join(lines) + "\n")
    return out


def heads_for(target: Path, given: str | None, train_minutes: float, threads: int) -> Path | None:
    """The heads file for `target`: given, else the trained one, else trained now (--train-minutes)."""
    from specgen.heads.model import heads_path, target_identity

    if given:
        return Path(given)
    path = heads_path(target_identity(target))
    if path.is_file():
        return path
    if train_minutes <= 0:
        print(f"no heads for {target.name}: skipped (give --heads FILE or --train-minutes N)", file=sys.stderr)
        return None
    subprocess.run([sys.executable, "-m", "specgen", "heads", "train", "-m", str(target), "--minutes", str(train_minutes),
                    "-t", str(threads), "-o", str(path)], check=True)
    return path


def bench(target: Path, configs: list[str], reqs: Path, args, temp: float, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "specgen", "bench", str(reqs), "-m", str(target), "-n", str(args.tokens),
           "--ignore-eos", "-r", str(args.repeats), "-t", str(args.threads), "--temp", str(temp), "-o", str(out),
           "--json"]
    for c in configs:
        cmd += ["-C", c]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"heads.py: specgen bench failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip() and '"request"' in line]


def figures(records: list[dict], configs: list[str], alone: str) -> dict:
    """Per configuration: geomean speedup per category and overall; the heads' time per round
    (the heads-alone configuration's steady drafting) against a plain target pass; head-1 acceptance."""
    cats = sorted({r["category"] for r in records})
    out: dict = {"speedup": {}, "categories": cats}
    for c in configs:
        per = {cat: geomean(r["speedup"][c] for r in records if r["category"] == cat) for cat in cats}
        per["all"] = geomean(r["speedup"][c] for r in records)
        per["bundled"] = geomean(r["speedup"][c] for r in records if r["category"] != "open-ended")
        out["speedup"][c] = per
    runs = [run for r in records for run in r["runs"]]
    plain = [run["verify_by_k"].get("0") for run in runs if run["config"] == "plain"]
    pass_s = sum(v[1] for v in plain if v) / max(sum(v[0] for v in plain if v), 1)
    steady = [run["draft_steady"] for run in runs if run["config"] == alone]
    rounds = sum(s["rounds"] for s in steady)
    heads_s = sum(s["s"] for s in steady) / rounds if rounds else float("nan")
    out["target_pass_ms"], out["heads_round_ms"] = 1000 * pass_s, 1000 * heads_s
    out["heads_share_of_pass"] = heads_s / pass_s if pass_s else float("nan")
    head1 = {}
    for cat in [*cats, "bundled", "all"]:
        rs = [run for r in records for run in r["runs"] if run["config"] == alone
              and (cat == "all" or cat == r["category"] or (cat == "bundled" and r["category"] != "open-ended"))]
        drafting = sum(n for run in rs for k, n in run["k_hist"].items() if int(k) > 0)
        acc = sum(run["per_position"][0] * sum(n for k, n in run["k_hist"].items() if int(k) > 0)
                  for run in rs if run["per_position"])
        head1[cat] = acc / drafting if drafting else float("nan")
    out["head1_acceptance"] = head1
    with_heads = next((c for c in configs if c.startswith("heads") and c != alone), None)
    lookup = next((c for c in configs if c.startswith("lookup")), None)
    if with_heads and lookup:  # the heads' own share: per request, heads (lookup alongside) over lookup alone
        ratio = {r["id"]: r["speedup"][with_heads] / r["speedup"][lookup] for r in records}
        out["heads_over_lookup"] = {cat: geomean(ratio[r["id"]] for r in records if cat == "all" or r["category"] == cat
                                                 or (cat == "bundled" and r["category"] != "open-ended"))
                                    for cat in [*cats, "bundled", "all"]}
    return out


def print_table(title: str, fig: dict, configs: list[str]) -> None:
    cats = [*fig["categories"], "bundled", "all"]
    print(f"\n{title}")
    print(f"{'config':<44}" + "".join(f"{c[:12]:>13}" for c in cats))
    for c in configs:
        label = "".join(Path(part).name if "/" in part else part for part in re.split(r"(?<==)([^:]*)", c))
        print(f"{label[:44]:<44}" + "".join(f"{fig['speedup'][c][cat]:>12.2f}x" for cat in cats))
    if fig.get("heads_over_lookup"):
        print(f"{'heads with lookup / lookup alone':<44}" + "".join(f"{fig['heads_over_lookup'][cat]:>12.2f}x" for cat in cats))
    print(f"{'head-1 acceptance (heads alone)':<44}" + "".join(f"{fig['head1_acceptance'][cat]:>13.2f}" for cat in cats))
    print(f"heads per round {fig['heads_round_ms']:.2f} ms · target pass {fig['target_pass_ms']:.2f} ms · "
          f"{100 * fig['heads_share_of_pass']:.1f} % of a pass")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", help="heads file for the F32 target (default: auto, or --train-minutes)")
    ap.add_argument("--heads-q4km", help="heads file for the embedded Q4_K_M target (default: auto, or --train-minutes)")
    ap.add_argument("--train-minutes", type=float, default=0.0, help="train missing heads for N minutes each (0: skip)")
    ap.add_argument("--targets", default="f32,q4km", help="comma-separated: f32 (with the Q4_0 draft beside), q4km")
    ap.add_argument("--requests", type=int, default=2, help="requests per category (and open-ended prompts)")
    ap.add_argument("--categories", help="comma-separated categories to run (default: all, open-ended included)")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each request in each configuration")
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.8], help="temperatures (0 = greedy)")
    ap.add_argument("--seeds", type=int, default=1, help="sampled runs: each request with this many seeds (greedy: one)")
    ap.add_argument("-k", type=int, default=4, help="draft length of the heads-alone configuration")
    ap.add_argument("--policy", default="cost", help="policy of the heads (and draft) configurations: cost (the goal's), fixed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_out", help="also write every figure here")
    args = ap.parse_args()
    if args.seeds < 1:
        sys.exit("heads.py: --seeds must be >= 1")
    from specgen.engine.quantize import paying_pair
    from specgen.models.registry import resolve_model

    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        cats = {c.strip() for c in args.categories.split(",") if c.strip()} if args.categories else None
        reqs = requests_file(args.requests, Path(tmp) / "requests.jsonl", cats)
        if not reqs.read_text().strip():
            sys.exit(f"heads.py: no request in categories {args.categories}")
        for name in [t.strip() for t in args.targets.split(",") if t.strip()]:
            if name not in ("f32", "q4km"):
                sys.exit(f"heads.py: unknown target '{name}' (choose f32, q4km)")
            if name == "f32":
                target, draft = paying_pair()
                heads = heads_for(target, args.heads, args.train_minutes, args.threads)
            else:
                target, draft = resolve_model("gemma3-270m"), None
                heads = heads_for(target, args.heads_q4km, args.train_minutes, args.threads)
            if heads is None:
                continue
            alone = f"heads={heads}:k={args.k}"
            pol = f"policy={args.policy}" if args.policy != "fixed" else f"k={args.k},lookup=on"
            lookup = "lookup:policy=cost" if args.policy != "fixed" else f"lookup:k={args.k}"
            configs = [f"heads={heads}:{pol}", alone, lookup] + ([f"draft={draft}:{pol}"] if draft else [])
            for temp in args.temps:
                seeded = reqs if temp <= 0 or args.seeds <= 1 else \
                    requests_file(args.requests, Path(tmp) / "seeded.jsonl", cats, args.seeds)
                records = bench(target, configs, seeded, args, temp, Path(tmp) / f"{name}-{temp}.jsonl")
                names = list(records[0]["speedup"]) if records else []
                fig = figures(records, names, next(n for n in names if n.startswith("heads") and n.endswith(f":k={args.k}")))
                report[f"{name} temp {temp:g}"] = fig
                seeds = f" · {args.seeds} seeds a request" if seeded is not reqs else ""
                print_table(f"{target.name} · temperature {temp:g} · {args.repeats} repeats{seeds} · {args.tokens} tokens",
                            fig, names)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
