"""specgen run / check / models through CliRunner and real subprocesses."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time

import pytest
from typer.testing import CliRunner

from specgen.cli import app

from helpers import specgen, start_specgen

pytestmark = pytest.mark.model
COPY_PROMPT = "Repeat exactly: alpha beta gamma delta. alpha beta gamma delta. alpha beta"


@pytest.fixture(autouse=True)
def _model_ready(gemma_path):
    """Assemble Gemma 3 270M once, before any subprocess needs it."""


def test_run_json_cli_runner():
    res = CliRunner().invoke(app, ["run", COPY_PROMPT, "-n", "12", "--json", "-c", "512"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)  # the whole of stdout is one JSON object
    assert obj["mode"] == "lookup" and obj["generated_tokens"] == len(obj["tokens"]) <= 12
    assert set(obj["timings"]) == {"prefill_s", "draft_prefill_s", "ttft_s", "decode_s", "total_s", "tokens_per_s"}
    spec = obj["spec"]
    assert spec["rounds"] <= obj["generated_tokens"]
    assert spec["accepted"] <= spec["drafted"]
    assert spec["mean_accepted_len"] == pytest.approx(obj["generated_tokens"] / spec["rounds"])


def test_run_text_stdout_has_no_stats():
    res = CliRunner().invoke(app, ["run", COPY_PROMPT, "-n", "12", "--no-spec", "-c", "512"])
    assert res.exit_code == 0, res.output
    assert "tok/s" not in res.stdout and "rounds" not in res.stdout
    assert "tok/s" in res.stderr and "mean accepted length" in res.stderr
    js = CliRunner().invoke(app, ["run", COPY_PROMPT, "-n", "12", "--no-spec", "-c", "512", "--json"])
    assert json.loads(js.stdout)["text"] == res.stdout
    assert json.loads(js.stdout)["spec"]["rounds"] == json.loads(js.stdout)["generated_tokens"]


def test_piped_stdin_goes_before_argument():
    text = "alpha beta gamma delta. alpha beta gamma delta."
    both = json.loads(specgen("run", "Repeat:", "-n", "4", "--json", "-c", "512", input=text, text=True).stdout)
    alone = json.loads(specgen("run", "Repeat:", "-n", "4", "--json", "-c", "512", input="", text=True).stdout)
    assert both["prompt_tokens"] > alone["prompt_tokens"] + 8
    res = specgen("run", "-n", "6", "-c", "512", input=COPY_PROMPT, text=True)
    assert res.returncode == 0 and res.stdout.strip()
    assert "Traceback" not in res.stderr


def test_seeded_sampling_is_reproducible():
    args = ["run", "Once upon a time", "-n", "10", "--temp", "0.9", "--seed", "7", "--json", "-c", "512"]
    a, b = (json.loads(CliRunner().invoke(app, args).stdout) for _ in range(2))
    assert a["tokens"] == b["tokens"]


def test_ctrl_c_prints_summary_and_exits_130():
    proc = start_specgen(
        "run", "Count: 1 2 3 4 5", "-n", "4000", "--ignore-eos", "-c", "4096", "--no-spec",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.time() + 60
    got = b""
    while time.time() < deadline and not got:
        time.sleep(0.2)
        got = proc.stdout.read() or b""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"interrupted" in err and b"tok/s" in err
    assert b"Traceback" not in err


def _one_line_error(res):
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specgen: error: "), res.stderr
    assert res.stdout == ""
    return lines[0]


def test_bad_inputs_one_line(tmp_path, gemma_path):
    notgguf = tmp_path / "x.gguf"
    notgguf.write_text("hello")
    trunc = tmp_path / "t.gguf"
    trunc.write_bytes(gemma_path.read_bytes()[:2_000_000])
    badtoml = tmp_path / "m.toml"
    badtoml.write_text("[models.x\npath = 1\n")
    cases = [
        (["run", "hi", "-m", str(tmp_path / "missing.gguf")], {}, "not found"),
        (["run", "hi", "-m", str(notgguf)], {}, "not a GGUF"),
        (["run", "hi", "-m", str(trunc)], {}, "truncated"),
        (["run", "hi", "-m", "no-such-model"], {}, "unknown model"),
        (["run", "hi"], {"SPECGEN_MODELS": str(badtoml)}, "m.toml"),
        (["run", ""], {}, "empty prompt"),
        (["run", "word " * 300, "-c", "32"], {}, "context"),
        (["run", "hi", "-k", "0"], {}, "-k"),
        (["run", "hi", "--temp", "-1"], {}, "--temp"),
        (["run", "hi", "--top-p", "0"], {}, "--top-p"),
        (["run", "hi", "--top-p", "1.5"], {}, "--top-p"),
        (["run", "hi", "-n", "abc"], {}, "--max-tokens"),
        (["run", "hi", "-m", "hf:nobody/nothing/x.gguf"], {"HF_HUB_OFFLINE": "1"}, "nobody/nothing"),
        (["run", "hi", "-d", str(tmp_path / "missing-draft.gguf")], {}, "not found"),
        (["check", str(gemma_path), str(notgguf)], {}, "not a GGUF"),
    ]
    for args, env, needle in cases:
        line = _one_line_error(specgen(*args, env=env, input="", text=True))
        assert needle in line, (args, line)


def test_draft_that_cannot_encode_text_is_refused(tmp_path, gemma_path, smollm_path, monkeypatch):
    from ggufs import write_spm_gguf

    import specgen.drafters.translated
    from specgen.session import open_draft

    # A tokenizer that cannot reproduce text (a hand-made vocabulary without byte
    # tokens crashes llama.cpp's tokenizer, so the probe's verdict is stood in for).
    monkeypatch.setattr(specgen.drafters.translated, "translation_problem", lambda t, d: "the draft model's tokenizer cannot reproduce text")
    tiny = write_spm_gguf(tmp_path / "tiny-spm.gguf")
    from specgen.engine.llama import Engine
    from specgen.errors import SpecgenError

    # open_draft compares on the engine it opens for drafting: a draft with weights
    # (SmolLM2; its fingerprint differs from Gemma's, so the detailed check runs)
    with Engine.vocab(gemma_path) as target, pytest.raises(SpecgenError) as err:
        open_draft(target, smollm_path, n_ctx=256)
    assert "tokenizer does not match" in str(err.value) and "cannot draft by translation" in str(err.value)
    res = CliRunner().invoke(app, ["check", str(gemma_path), str(tiny)])
    out = " ".join(res.output.split())  # the console may wrap lines
    assert res.exit_code == 1 and "incompatible" in out and "not usable by translation" in out


def test_check_reports_a_draft_usable_by_translation(tmp_path, gemma_path, smollm_path):
    from ggufs import write_spm_gguf

    for draft in (write_spm_gguf(tmp_path / "tiny-spm.gguf"), smollm_path):
        res = specgen("check", str(gemma_path), str(draft), text=True)
        assert res.returncode == 1, res.stderr
        out = " ".join(res.stderr.split())  # the console may wrap lines
        verdict = out[out.index("different vocabularies"):]
        assert verdict.startswith("different vocabularies — usable by translation") and "token " in verdict, out
    obj = json.loads(specgen("check", str(gemma_path), str(smollm_path), "--json", text=True).stdout)
    assert obj["compatible"] is False and obj["translatable"] is True


def test_run_with_a_translated_draft_says_so_once(gemma_path, smollm_path):
    res = specgen("run", "The capital of France is", "-m", str(gemma_path), "-d", str(smollm_path), "-n", "8", "-c", "512", "--json",
                  "-k", "3", input="", text=True)
    assert res.returncode == 0, res.stderr
    notes = [ln for ln in res.stderr.splitlines() if "drafting through text" in ln]
    assert len(notes) == 1
    obj = json.loads(res.stdout)
    assert obj["mode"] == "draft" and obj["spec"]["drafted"] > 0


def _translated_notes(stderr: str) -> list[str]:
    from specgen.cli.render import TRANSLATED_DRAFT

    return [ln for ln in stderr.splitlines() if TRANSLATED_DRAFT in ln]


@pytest.mark.parametrize("command", ["chat", "rewrite", "bench"])
def test_every_command_says_once_that_a_draft_drafts_through_text(command, gemma_path, smollm_path, tmp_path):
    small = ["-m", str(gemma_path), "-d", str(smollm_path), "-c", "512", "-t", "1"]
    if command == "chat":
        res = specgen("chat", *small, "-n", "4", "-k", "2", "--temp", "0", input="Hi\n", text=True)
    elif command == "rewrite":
        src = tmp_path / "a.txt"
        src.write_text("hello\n")
        res = specgen("rewrite", str(src), "-i", "Repeat the text.", *small, "-n", "4", "-k", "2",
                      "-o", str(tmp_path / "b.txt"), input="", text=True)
    else:
        res = specgen("bench", "-m", str(gemma_path), "-C", f"draft={smollm_path}:k=2", "--limit", "1", "-n", "4",
                      "--no-warmup", "-c", "512", "-t", "1", input="", text=True)
    assert "Traceback" not in res.stderr
    # rewrite may stop at -n before the model finishes (exit 2, its own one-line error): the note came first either way
    assert res.returncode in ((0, 2) if command == "rewrite" else (0,)), res.stderr
    assert len(_translated_notes(res.stderr)) == 1, res.stderr


@contextlib.contextmanager
def serving(*args):
    """`specgen serve ARGS` on a free loopback port: yields (url, stderr lines so far); SIGTERM at the end, exit 0."""
    import httpx

    p = start_specgen("serve", "--port", "0", "-c", "512", "-t", "1", "--parallel", "1", *args,
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        m = None
        for line in p.stderr:
            lines.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)/v1", line)
            if m:
                break
        assert m, "".join(lines)
        for _ in range(100):  # serving (its signal handlers in place) once /health answers
            try:
                httpx.get(m.group(1) + "/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield m.group(1), lines
        p.send_signal(signal.SIGTERM)
        lines.append(p.stderr.read())
        assert p.wait(timeout=60) == 0, "".join(lines)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in "".join(lines)


def test_serve_with_a_translated_draft_says_so_once_too(gemma_path, smollm_path):
    with serving("-m", str(gemma_path), "-d", str(smollm_path)) as (url, lines):
        pass
    err = "".join(lines)
    assert "listening on" in err and len(_translated_notes(err)) == 1, err


@pytest.mark.parametrize("flag", ["on", "off"])
def test_serve_global_cache_drafts_a_request_from_an_earlier_one(flag):
    """Counting is not in the prompt: only an index over the first request can draft the second, the same one."""
    import httpx

    body = {"prompt": "Count: 1, 2, 3, 4, 5,", "max_tokens": 16, "temperature": 0}
    with serving("--suffix", "-k", "8", "--global-cache", flag) as (url, lines):
        first, second = [httpx.post(url + "/v1/completions", json=body, timeout=600).json() for _ in range(2)]
    assert ("global index over earlier requests" in " ".join("".join(lines).split())) == (flag == "on")  # (rich wraps)
    spec = second["speculative"]
    assert first["speculative"]["mode"] == spec["mode"] == "suffix"
    if first["choices"][0]["text"] == second["choices"][0]["text"] and flag == "on":
        # the whole first reply was there to draft: rounds after the prefill's own token draft it all
        assert spec["accepted"] >= second["usage"]["completion_tokens"] - spec["rounds"], spec
    if flag == "off":
        assert spec["accepted"] <= first["speculative"]["accepted"] + 2, (first["speculative"], spec)  # no memory


def test_check_compatible_pair(gemma_path, draft_path):
    res = specgen("check", str(gemma_path), str(draft_path), text=True)
    assert res.returncode == 0, res.stderr
    assert "compatible" in res.stderr


def test_models_lists_default_as_present():
    res = CliRunner().invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    default = [m for m in obj["models"] if m["default"]]
    assert default and default[0]["present"] is True
    assert obj["pairs"]


@pytest.mark.parametrize("flags, alongside", [
    ({}, True),  # the default: the cost policy weighs lookup's offers against the model
    ({"lookup": False}, False),  # --no-lookup: the model alone
    ({"draft_max": 4}, False),  # a fixed k means the model's k
    ({"draft_max": 4, "lookup": True}, True),  # unless lookup is asked for too (offers first, as llama.cpp)
])
def test_a_draft_model_drafts_with_prompt_lookup_alongside_by_default(gemma_path, draft_path, flags, alongside):
    from specgen.drafters.model import DraftModel, WithLookup
    from specgen.session import ModelOptions, open_session

    loaded = open_session(ModelOptions(model=str(gemma_path), draft=str(draft_path), ctx_size=256, threads=1, **flags))
    try:
        assert isinstance(loaded.drafter, WithLookup if alongside else DraftModel)
        assert loaded.mode == "draft" and loaded.draft_engine is loaded.drafter.engine
        if alongside and "draft_max" not in flags:  # lookup's offers reach 16, the model's drafts 8
            assert (loaded.draft_max, loaded.drafter.model_max) == (16, 8)
        elif alongside:
            assert (loaded.draft_max, loaded.drafter.model_max) == (4, 4)
        if alongside:  # beside the model, lookup offers matches of two tokens or more
            assert loaded.drafter.lookup.ngram_min == 2
    finally:
        loaded.close()


@pytest.mark.parametrize("given, alone, alongside", [(None, 1, 2), (1, 1, 1), (3, 3, 3)])
def test_lookup_shortest_match_is_two_beside_a_draft_model_unless_given(given, alone, alongside):
    from specgen.session import ModelOptions

    opts = ModelOptions(ngram_min=given)
    opts.validate()
    assert (opts.plan("lookup").drafting.ngram_min, opts.plan("draft").drafting.alongside_ngram_min) == (alone, alongside)


def test_no_lookup_without_a_draft_model_is_one_clear_error(gemma_path):
    line = _one_line_error(specgen("run", "-m", str(gemma_path), "--no-lookup", "-n", "2", "Hi", input="", text=True))
    assert "--no-lookup needs a draft model" in line


# -- run through the model's chat template ------------------------------------------------


@pytest.fixture
def fed(monkeypatch):
    """What run hands Session.generate: the token list of a template, or the text itself (raw)."""
    from specgen.session import Session

    seen = []
    orig = Session.generate

    def generate(self, prompt, **kw):
        seen.append(prompt)
        return orig(self, prompt, **kw)

    monkeypatch.setattr(Session, "generate", generate)
    return seen


def _run_json(*args, input=None):
    res = CliRunner().invoke(app, ["run", *args, "-c", "512", "-t", "1", "--json"], input=input)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _rendered(model, messages):
    """The GGUF's own template rendered over `messages`, tokenized with its control tokens (this model adds no BOS)."""
    from specgen.apps.chat import render as render_template
    from specgen.apps.chat import ChatFormat
    from specgen.engine.llama import Engine

    with Engine.vocab(model) as e:
        assert not e.vocab_info().add_bos
        text = render_template(ChatFormat("gguf", e.chat_template()), messages)
        return text, e.tokenize(text, add_special=False, parse_special=True)


HAIKU = "Write a haiku about the sea."


def test_run_on_an_instruct_model_feeds_the_gguf_template(smollm_path, fed):
    obj = _run_json(HAIKU, "-m", str(smollm_path), "-n", "2")
    text, tokens = _rendered(smollm_path, [{"role": "user", "content": HAIKU}])
    assert text.startswith("<|im_start|>system\n") and text.endswith(f"<|im_start|>user\n{HAIKU}<|im_end|>\n<|im_start|>assistant\n")
    assert fed == [tokens] and obj["prompt_tokens"] == len(tokens)
    assert obj["template"] == "gguf"


def test_run_composes_piped_stdin_and_the_argument_into_one_user_turn(smollm_path, fed):
    obj = _run_json("Summarise:", "-m", str(smollm_path), "-n", "2", input="the cat sat on the mat\n")
    _, tokens = _rendered(smollm_path, [{"role": "user", "content": "the cat sat on the mat\nSummarise:"}])
    assert fed == [tokens] and obj["template"] == "gguf"


def test_run_system_lands_in_the_system_turn(smollm_path, fed):
    obj = _run_json(HAIKU, "--system", "Answer in French.", "-m", str(smollm_path), "-n", "2")
    msgs = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": HAIKU}]
    text, tokens = _rendered(smollm_path, msgs)
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>\n") and "SmolLM" not in text
    assert fed == [tokens] and obj["template"] == "gguf"


def test_run_raw_completes_the_text_verbatim(smollm_path, fed):
    obj = _run_json(HAIKU, "--raw", "-m", str(smollm_path), "-n", "2")
    assert fed == [HAIKU] and obj["template"] == "raw"
    from specgen.engine.llama import Engine

    with Engine.vocab(smollm_path) as e:
        assert obj["prompt_tokens"] == len(e.tokenize(HAIKU))


def test_run_on_a_base_model_completes_raw_without_a_note(gemma_path, fed):
    res = CliRunner().invoke(app, ["run", HAIKU, "-m", str(gemma_path), "-n", "2", "-c", "512", "-t", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert fed == [HAIKU] and json.loads(res.stdout)["template"] == "raw"
    assert "template" not in res.stderr


def test_the_default_model_runs_through_its_template(fed):
    assert _run_json(HAIKU, "-n", "2")["template"] == "gguf" and isinstance(fed[0], list)


@pytest.mark.parametrize("model, raw, needle", [
    ("smollm", True, "not with --raw"),
    ("gemma", False, "this model's GGUF has none"),
])
def test_run_system_without_a_template_is_one_clear_error(smollm_path, gemma_path, model, raw, needle):
    path = smollm_path if model == "smollm" else gemma_path
    line = _one_line_error(specgen("run", "Hi", "-m", str(path), "--system", "Be brief.", *(["--raw"] if raw else []),
                                   "-n", "2", "-c", "512", input="", text=True))
    assert needle in line
