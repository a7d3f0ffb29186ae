"""Local models and pairing (issue 31's goals), both in one run:

  1. `specgen models --local` over --files GGUFs (default 50, tiny to medium: vocabularies
     of 300 to 50,000 tokens, tensors of 1k to 1M parameters, written here into a temp
     folder): the scan's time in process, cold (fingerprints computed) and warm (cached),
     and the whole command's wall time; goal: under 1 s.
  2. With the F32 copy and the Q4_0 draft of Gemma 3 270M (written once from the embedded
     model into specgen's cache, test-drafts/, as the test suite does) alone in a local
     folder: `specgen pair` must pick the Q4_0 draft for the F32 target, and
     `run --pair auto` must reach >= 0.95x the speed of `run --draft Q4_0`, interleaved
     A/B, --repeats each, medians of decode tok/s and of wall time.

    python benchmarks/pairing.py [--files 50] [--repeats 5] [-n 64] [-t 1] [--scan-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's specgen, never an installed copy

PROMPT = ("Here is a list of the planets of the solar system, from the closest to the Sun to the farthest, "
          "with one sentence about each:\n1. Mercury")
VOCABS = (300, 32_000, 50_000)


def write_gguf(path: Path, n_vocab: int, n_params: int) -> None:
    """A GGUF with a BPE-style vocabulary of n_vocab tokens and one F32 tensor of n_params."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_head_count(2)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"tok{i}" for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges([f"t ok{i}" for i in range(min(n_vocab, 1000))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("weights", np.zeros(n_params, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def scan_part(files: int, work: Path) -> dict:
    folder = work / "gguf"
    folder.mkdir()
    for i in range(files):
        n_params = int(1_000 * (1_000 ** (i / max(files - 1, 1))))  # 1k … 1M, geometric
        write_gguf(folder / f"m{i:03d}.gguf", VOCABS[i % len(VOCABS)], n_params)
    total = sum(p.stat().st_size for p in folder.iterdir())
    env = {**os.environ, "SPECGEN_MODEL_DIRS": str(folder), "SPECGEN_CACHE": str(work / "cache"),
           "HF_HUB_CACHE": str(work / "none"), "OLLAMA_MODELS": str(work / "none"), "HOME": str(work / "home"),
           "PYTHONPATH": str(HERE.parent)}
    code = ("import time, json; from specgen.models.local import scan; t = time.perf_counter(); s = scan(); "
            "print(json.dumps({'s': time.perf_counter() - t, 'n': len(s.models)}))")
    cold = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    warm = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout)["s"] for _ in range(3)]
    walls = []
    for _ in range(3):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "specgen", "models", "--local", "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
        walls.append(time.perf_counter() - t)
    listed = len(json.loads(out)["models"])
    return {"files": files, "bytes": total, "listed": listed, "cold_scan_s": cold["s"],
            "warm_scan_s": statistics.median(warm), "command_wall_s": statistics.median(walls)}


def gemma_pair() -> tuple[Path, Path]:
    """The F32 target and its Q4_0 draft: the same files the test suite writes."""
    from specgen.engine.quantize import paying_pair

    return paying_pair()


def run_once(args: list[str], env: dict) -> dict:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "specgen", "run", *args, "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"pairing.py: specgen run failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    obj = json.loads(p.stdout)
    return {"tok_s": obj["timings"]["tokens_per_s"], "wall_s": wall, "mode": obj["mode"], "text": obj["text"],
            "stderr": p.stderr}


def pair_part(work: Path, repeats: int, n: int, threads: int) -> dict:
    f32, q4 = gemma_pair()
    folder = work / "pair"
    folder.mkdir()
    os.symlink(f32, folder / f32.name)
    os.symlink(q4, folder / q4.name)
    env = {**os.environ, "SPECGEN_MODEL_DIRS": str(folder), "HF_HUB_CACHE": str(work / "none"),
           "OLLAMA_MODELS": str(work / "none"), "PYTHONPATH": str(HERE.parent)}
    if "SPECGEN_CACHE" not in env:  # HOME moves below: keep the cost profiles and the test models where they are
        from specgen.models.cache import cache_root

        env["SPECGEN_CACHE"] = str(cache_root())
    env["HOME"] = str(work / "home")
    target = str(folder / f32.name)
    p = subprocess.run([sys.executable, "-m", "specgen", "pair", target, "--json", "-t", str(threads)], env=env,
                       capture_output=True, text=True)
    chosen = json.loads(p.stdout)["chosen"] if p.returncode == 0 else None
    picked = chosen is not None and Path(chosen["path"]).name == q4.name
    common = [PROMPT, "-m", target, "-n", str(n), "-t", str(threads), "-c", "1024", "--ignore-eos"]
    arms = {"pair auto": common + ["--pair", "auto"], "draft by hand": common + ["--draft", str(folder / q4.name)]}
    runs: dict[str, list[dict]] = {k: [] for k in arms}
    run_once(arms["draft by hand"], env)  # warm-up: pages the weights in, takes the cost profiles
    for i in range(repeats):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))  # interleaved, alternating first
        for name in order:
            runs[name].append(run_once(arms[name], env))
    med = {k: {"tok_s": statistics.median(r["tok_s"] for r in v), "wall_s": statistics.median(r["wall_s"] for r in v)}
           for k, v in runs.items()}
    auto_line = next((x for x in runs["pair auto"][0]["stderr"].splitlines() if x.startswith("--pair auto")), "")
    return {"target": f32.name, "chosen": chosen["name"] if chosen else None, "picked_q4_0": picked,
            "auto_line": auto_line, "modes": sorted({r["mode"] for v in runs.values() for r in v}),
            "same_text": len({r["text"] for v in runs.values() for r in v}) == 1, "repeats": repeats, "n": n,
            "threads": threads, "median": med,
            "tok_s": {k: [round(r["tok_s"], 2) for r in v] for k, v in runs.items()},
            "ratio_tok_s": med["pair auto"]["tok_s"] / med["draft by hand"]["tok_s"],
            "ratio_wall": med["draft by hand"]["wall_s"] / med["pair auto"]["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=50, help="GGUF files for the scan's timing")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each arm of the A/B")
    ap.add_argument("-n", type=int, default=64, help="tokens per run")
    ap.add_argument("-t", "--threads", type=int, default=1, help="CPU threads of each run")
    ap.add_argument("--scan-only", action="store_true", help="only the scan's timing (no model runs)")
    a = ap.parse_args()
    if a.files < 1 or a.repeats < 1 or a.n < 2 or a.threads < 1:
        sys.exit("pairing.py: --files, --repeats, -t need >= 1 and -n >= 2")
    with tempfile.TemporaryDirectory(prefix="specgen-pairing-") as tmp:
        work = Path(tmp)
        s = scan_part(a.files, work)
        print(f"scan: {s['listed']}/{s['files']} GGUF files ({s['bytes'] / 1e6:.1f} MB) listed; "
              f"scan {s['cold_scan_s']:.3f} s cold (fingerprints computed), {s['warm_scan_s']:.3f} s warm; "
              f"`specgen models --local --json` {s['command_wall_s']:.2f} s wall (goal: under 1 s)")
        result = {"scan": s}
        if not a.scan_only:
            p = pair_part(work, a.repeats, a.n, a.threads)
            result["pair"] = p
            print(f"pair: {p['target']} -> {p['chosen']} ({'the Q4_0 draft' if p['picked_q4_0'] else 'NOT the Q4_0 draft'})")
            print(f"      {p['auto_line']}")
            for name, m in p["median"].items():
                print(f"{name:>14}: median {m['tok_s']:.1f} tok/s decode, {m['wall_s']:.2f} s wall "
                      f"({p['repeats']} runs, -n {p['n']}, -t {p['threads']})")
            print(f"run --pair auto vs --draft by hand: {p['ratio_tok_s']:.3f}x decode tok/s, {p['ratio_wall']:.3f}x wall "
                  f"(goal >= 0.95x); modes {p['modes']}, same text: {p['same_text']}")
        print(json.dumps(result))


if __name__ == "__main__":
    main()
