"""suffix.py's llama.cpp side: its model-free speculative types run as its own tools,
their figures over the tokens specgen counts, their text against plain's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


# every model-free type of llama.cpp: `lookup` is the llama-lookup tool (n-gram caches
# over the prompt and output), the rest llama-speculative-simple --spec-type TYPE
LLAMA_TYPES = ("lookup", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
LLAMA_TOOLS = ("llama-speculative-simple", "llama-lookup")


def llama_tools_ok(tools) -> bool:
    return bool(tools) and all((Path(tools) / t).exists() for t in LLAMA_TOOLS)


def find_tools(given: str | None) -> str | None:
    """llama.cpp's build/bin: --tools DIR (both tools there, else one line and exit), '' for
    none, or by default their folder when both are on PATH (else none, said in one line)."""
    if given == "":
        return None
    if given is not None:
        if not llama_tools_ok(given):
            sys.exit(f"suffix: no {' or '.join(LLAMA_TOOLS)} in {given} (build llama.cpp's tools, or --tools '')")
        return given
    found = shutil.which(LLAMA_TOOLS[0])
    if found and llama_tools_ok(Path(found).parent):
        return str(Path(found).parent)
    print(f"suffix: {LLAMA_TOOLS[0]} is not on PATH: llama.cpp's types are left out (--tools DIR)", file=sys.stderr)
    return None


def llama_spec(tools, model, text, spec_type, n, threads, ctx, k_max, draft=None):
    """One greedy run of llama.cpp's tool for `spec_type` (a model-free type, or
    "draft-simple" with `draft`, the draft model's path)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text + "\n")  # llama.cpp's -f drops one trailing newline: the same tokens as specgen's
    if spec_type == "lookup":
        cmd = [str(Path(tools) / "llama-lookup")]
    else:
        cmd = [str(Path(tools) / "llama-speculative-simple"), "--spec-type", spec_type]
    if draft is not None:
        cmd += ["-md", str(draft), "-td", str(threads)]
    out = subprocess.run(
        # -n n - 1: llama.cpp counts the prompt's first sampled token apart ("decoded n + 1")
        cmd + ["-m", str(model), "-f", f.name, "-n", str(n - 1), "-t", str(threads), "-c", str(ctx),
               "--temp", "0", "--ignore-eos", "--spec-draft-n-max", str(k_max)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    Path(f.name).unlink()
    log = out.stderr + out.stdout
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    if out.returncode != 0 or not m:
        return {"error": (log.strip().splitlines() or ["no output"])[-1]}
    acc = re.search(r"accept\s+=\s+([\d.]+)%", log)
    enc = re.search(r"encoded\s+(\d+) tokens", log)
    r = {"tokens_per_s_raw": float(m.group(3)), "generated": int(m.group(1)), "decode_s": float(m.group(2)),
         "prompt_tokens": int(enc.group(1)) if enc else None,
         "acceptance": float(acc.group(1)) / 100 if acc else None}
    return {**r, "tokens_per_s": same_count_rate(r, n, spec_type), "text": generated_text(out.stdout, text)}


def generated_text(stdout: str, prompt: str) -> str:
    """What a llama.cpp tool wrote after echoing the prompt (its stdout holds both; the
    first occurrence: a model that writes another request after its answer repeats the
    prompt's end in its own text)."""
    at = stdout.find(prompt)
    if at >= 0:
        return stdout[at + len(prompt):]
    tail = prompt[-40:]
    at = stdout.find(tail)
    return stdout[at + len(tail):] if at >= 0 else stdout


def follows(text: str, plain_text: str) -> int | None:
    """None where llama.cpp's greedy text is plain's (as far as both go; it decodes past
    n), else the character where it parts (a near-tie: its speed is of another text)."""
    m = min(len(text.rstrip()), len(plain_text.rstrip()))
    return next((i for i in range(m) if text[i] != plain_text[i]), None if m else 0)


def same_count_rate(r, n, spec_type):
    """llama.cpp's decode speed over as many tokens as specgen's figure counts. Its tools
    run on past -n: a round's accepted draft is not cut at the limit (llama-lookup), and
    some types draft past it (ngram-simple, -map-k, -mod decoded 144-192 tokens for 128
    asked), and they print decoded / seconds, so the tokens past n, copied in a few long
    passes, raised their figure. Here: the tokens up to n over the whole time (what it
    took to have them; the last pass's extra rows are counted against it, so this is
    the lower bound, the printed figure the upper). llama-lookup's first token is
    sampled from the prompt's logits inside its clock: not counted, as specgen's is not."""
    counted = min(r["generated"], n) - (1 if spec_type == "lookup" else 0)
    secs = r.get("decode_s") or r["generated"] / r["tokens_per_s_raw"]
    return counted / secs if secs > 0 else float("nan")


def same_counts(results, n):
    """Records taken before `same_count_rate` (llama.cpp's printed figure as tokens_per_s):
    the printed one kept as tokens_per_s_raw, tokens_per_s over the same count."""
    for per in results.values():
        for c, rs in per.items():
            for r in rs:
                if "tokens_per_s" not in r or "tokens_per_s_raw" in r:
                    continue
                r["tokens_per_s_raw"] = r["tokens_per_s"]  # specgen's: the same count already
                if c.startswith("llama:"):
                    r["tokens_per_s"] = same_count_rate(r, n, c.split(":", 1)[1])
