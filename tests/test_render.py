"""The command line's shared parts without a model: the one text streamer, follow(), retold options, tune's prediction."""

import io
import typing
from types import SimpleNamespace

import pytest

from specgen.cli import options, render
from specgen.cli.tune import predicted_rates
from specgen.policy.base import expected_tokens_per_round


def a_round(tokens, drafted, accepted):
    return SimpleNamespace(tokens=tokens, drafted=drafted, accepted=accepted)


class Utf8Engine:
    """One token per byte of UTF-8: a character may straddle two rounds."""

    def piece(self, t):
        return bytes([t])


def rounds_of(*parts):
    """Rounds from (drafted text, own text) pairs, as the loop would emit them."""
    out = []
    for drafted, own in parts:
        d, o = list(drafted.encode()), list(own.encode())
        out.append(a_round(d + o, len(d) + 1, len(d)))
    return out


def test_stream_colours_accepted_drafts_and_keeps_the_text():
    out = io.StringIO()
    s = render.TextStream(Utf8Engine(), out, colour=True)
    for r in rounds_of(("ab", "c"), ("", "d")):
        s.write_round(r)
    assert s.finish() == "abcd" == s.text
    assert out.getvalue() == f"{render.DRAFT_COLOUR}ab{render.RESET}cd"


def test_stream_joins_a_character_split_across_rounds():
    out = io.StringIO()
    s = render.TextStream(Utf8Engine(), out, colour=False)
    e_acute = "é".encode()
    s.write_round(a_round([e_acute[0]], 0, 0))
    assert out.getvalue() == ""  # half a character is not written
    s.write_round(a_round([e_acute[1], ord("!")], 0, 0))
    assert s.finish() == "é!" == out.getvalue()


def test_stream_holds_back_a_stop_string_and_writes_nothing_from_it():
    out = io.StringIO()
    s = render.TextStream(Utf8Engine(), out, stops=["\n```"], colour=False)
    s.write_round(rounds_of(("", "done\n`"))[0])
    assert out.getvalue() == "done" and not s.stopped  # "\n`" may begin the stop string
    s.write_round(rounds_of(("``", " tail"))[0])
    assert s.stopped and s.finish() == "done" == out.getvalue() == "".join(s.written)


def test_stream_without_an_output_writes_nothing_but_keeps_the_text():
    s = render.TextStream(Utf8Engine(), None)
    for r in rounds_of(("ab", "c")):
        s.write_round(r)
    assert s.finish() == "abc" and s.written == []


class ScriptedGeneration:
    """Yields scripted rounds; `interrupt_at` raises KeyboardInterrupt there, as Ctrl-C would."""

    def __init__(self, rounds, interrupt_at=None):
        self.rounds, self.interrupt_at = rounds, interrupt_at
        self.stats = SimpleNamespace(stop_reason="")

    def __iter__(self):
        for i, r in enumerate(self.rounds):
            if i == self.interrupt_at:
                raise KeyboardInterrupt
            yield r
        self.stats.stop_reason = "eos"

    def interrupt(self):
        self.stats.stop_reason = self.stats.stop_reason or "interrupted"


def test_follow_stops_at_a_stop_string():
    gen = ScriptedGeneration(rounds_of(("", "one"), ("", " END"), ("", "never")))
    seen = []
    s = render.TextStream(Utf8Engine(), io.StringIO(), stops=["END"])
    assert render.follow(gen, s, lambda st, r: seen.append(r)) is False
    assert gen.stats.stop_reason == "stop" and len(seen) == 2 and s.text == "one "


def test_follow_reports_ctrl_c_and_flushes_what_came_before():
    gen = ScriptedGeneration(rounds_of(("", "one"), ("", "two")), interrupt_at=1)
    out = io.StringIO()
    s = render.TextStream(Utf8Engine(), out)
    assert render.follow(gen, s) is True
    assert gen.stats.stop_reason == "interrupted" and out.getvalue() == "one"


def test_retold_keeps_the_flags_and_changes_only_the_help():
    _, shared = typing.get_args(options.SeedOpt)
    shared_help = shared.help
    told = options.retold(options.SeedOpt, "Seed for every request.", int)
    base, info = typing.get_args(told)
    assert base is int and info.help == "Seed for every request."
    assert (info.default, info.param_decls) == (shared.default, shared.param_decls)
    assert shared.help == shared_help and shared_help.startswith("Seed for sampled runs")  # the shared option is untouched


def test_tune_prediction_is_leviathans():
    verify = [0.0, 0.010] + [0.010 + 0.001 * n for n in range(1, 32)]
    rows = predicted_rates([0.8] * 4, verify, 0.002, 6)
    assert [r["k"] for r in rows] == list(range(7))
    assert rows[0]["tokens_per_round"] == 1.0 and rows[0]["speedup"] == pytest.approx(1.0)
    for r in rows:  # past the measured positions, the last α holds
        assert r["tokens_per_round"] == pytest.approx(expected_tokens_per_round(0.8, r["k"]))
        assert r["round_s"] == pytest.approx(verify[r["k"] + 1] + r["k"] * 0.002)
    assert predicted_rates([], verify, 0.0, 2)[2]["tokens_per_round"] == 1.0
