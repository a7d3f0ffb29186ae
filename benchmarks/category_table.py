"""Per-category median speedup [95% CI] of every configuration in a `specgen bench --json` summary,
as one Markdown table (for README and notes):  python benchmarks/category_table.py summary.json"""

import json
import sys


def main(path: str) -> None:
    d = json.load(open(path))
    s = d["summary"]
    cfgs = list(s)
    cats = list(s[cfgs[0]]["categories"]) + ["overall"]
    print("| category | " + " | ".join(cfgs) + " |")
    print("| --- |" + " --- |" * len(cfgs))
    for cat in cats:
        cells = []
        for c in cfgs:
            v = s[c]["overall"] if cat == "overall" else s[c]["categories"][cat]
            lo, hi = v["median_ci95"]
            cells.append(f"{v['median_speedup']:.2f}× [{lo:.2f}–{hi:.2f}]")
        print(f"| {cat} | " + " | ".join(cells) + " |")
    o = d["overhead"]
    print(f"\nbench overhead: {1000 * o['overhead_s']:.0f} ms of {o['measured_s']:.0f} s "
          f"({100 * o['overhead_share']:.2f}%, {o['overhead_per_run_ms']:.1f} ms a run)")


if __name__ == "__main__":
    main(sys.argv[1])
