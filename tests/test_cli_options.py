"""The shared options: declared once (specgen.cli.options.SHARED), taken by every command with `takes`."""

import ast
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner
from typing_extensions import Annotated

from specgen.cli import app, options
from specgen.cli.options import MACHINE, MODEL, NGRAM, POLICY, SAMPLING, SHARED, Told, takes

CLI = Path(options.__file__).parent
COMMANDS = {c.name: c for c in typer.main.get_command(app).commands.values()}
# What each command takes of the shared options; the four that load models for one generation share the most.
GENERATING = (*MODEL, "max_tokens", *SAMPLING, *MACHINE, *NGRAM)
TAKES = {
    "run": ("system", "raw", *GENERATING, "ignore_eos", *POLICY, "json_out", "suffix"),
    "chat": ("system", *GENERATING, "template", "suffix", "global_cache", "json_out"),
    "rewrite": (*GENERATING, "template"),
    "serve": (*GENERATING, "ignore_eos", *POLICY, "template", "suffix", "global_cache"),
    "tune": ("model", "draft", "heads", "lookup", "pair", "max_tokens", *MACHINE, "json_out"),
    "bench": ("model", "heads", "max_tokens", "ignore_eos", *SAMPLING, *MACHINE, "json_out", "global_cache"),
}


def declaration(option) -> list:
    """An Annotated option's flag strings (typer keeps the first one as the OptionInfo's default)."""
    info = typing.get_args(option)[1]
    return [info.default, *info.param_decls]


def flags(option) -> list:
    """Its flags one by one: "--lookup/--no-lookup" is two."""
    return [f for decl in declaration(option) for f in decl.split("/")]


def declared_flags() -> list:
    """Every flag string given to typer.Option(...) in specgen/cli, once per declaration."""
    out = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Option":
                out += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return out


def test_each_shared_option_is_declared_once():
    declared = declared_flags()
    for name, (option, _) in SHARED.items():
        for flag in declaration(option):
            assert declared.count(flag) == 1, f"{flag} ({name}) is declared {declared.count(flag)} times in specgen/cli"


@pytest.mark.parametrize("command", sorted(TAKES))
def test_each_command_takes_its_shared_options_with_their_flags(command):
    cmd = COMMANDS[command]
    params = {p.name: p for p in cmd.params}
    assert set(TAKES[command]) == set(params) & set(SHARED)
    assert cmd.callback.shared == tuple(n for n in params if n in SHARED)  # every shared option through takes()
    for name in TAKES[command]:
        p = params[name]
        assert [*p.opts, *p.secondary_opts] == flags(SHARED[name][0]), name
    help_text = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
    for name in TAKES[command]:
        assert flags(SHARED[name][0])[-1] in help_text, f"{command} --help lost {name}"


def test_the_shared_options_read_the_same_across_commands_unless_told():
    """Help text and default of a shared option are the declaration's, wherever a command does not tell it its way."""
    told = {"run": {"system"}, "chat": {"max_tokens", "temp", "json_out"}, "rewrite": {"max_tokens", "template"},
            "serve": {"max_tokens", "template"}, "tune": {"max_tokens", "ctx_size"},
            "bench": {"model", "heads", "max_tokens", "ignore_eos", "temp", "top_k", "top_p", "min_p", "seed", "json_out", "global_cache"}}
    for command, names in TAKES.items():
        params = {p.name: p for p in COMMANDS[command].params}
        for name in names:
            if name in told.get(command, ()):
                continue
            option, default = SHARED[name]
            assert params[name].help == typing.get_args(option)[1].help, (command, name)
            assert params[name].default == default, (command, name)


def test_told_changes_only_help_default_and_type():
    params = {p.name: p for p in COMMANDS["bench"].params}
    assert params["seed"].default == 0 and params["seed"].opts == ["--seed"]
    assert params["seed"].help.startswith("Seed for requests that set none")
    chat = {p.name: p for p in COMMANDS["chat"].params}
    assert chat["temp"].default == 0.7 and chat["max_tokens"].opts == ["-n", "--max-tokens"]
    assert typing.get_args(SHARED["temp"][0])[1].help == "Temperature; 0 = greedy."  # the declaration is untouched
    tune = {p.name: p for p in COMMANDS["tune"].params}
    assert tune["ctx_size"].default == 2048 and tune["ctx_size"].help == "Context size in tokens."


def test_takes_hands_the_command_one_model_options_and_sampling_params():
    from specgen.rules.sampling import SamplingParams
    from specgen.session import ModelOptions

    seen = {}

    @takes("prompt", *MODEL, *SAMPLING, *MACHINE, *NGRAM, *POLICY, "suffix", "global_cache", "tree_width",
           temp=Told(default=0.5))
    def cmd(
        prompt: Annotated[str, typer.Argument()] = "",
        tree_width: Annotated[int, typer.Option("--tree-width")] = 1,
        *, opts, params, seed, draft_max,
    ) -> None:
        seen.update(prompt=prompt, opts=opts, params=params, seed=seed, draft_max=draft_max)

    one = typer.Typer(add_completion=False)
    one.command()(cmd)
    args = ["hi", "-m", "m.gguf", "-k", "3", "--suffix", "--global-cache", "on", "--tree-width", "2", "--seed", "7", "-c", "512"]
    res = CliRunner().invoke(one, args)
    assert res.exit_code == 0, res.output
    assert seen["opts"] == ModelOptions(model="m.gguf", draft_max=3, ctx_size=512, drafter="suffix", global_cache=True,
                                        tree_width=2)
    assert seen["params"] == SamplingParams(temperature=0.5, seed=7)
    assert (seen["prompt"], seen["seed"], seen["draft_max"]) == ("hi", 7, 3)
    order = [p.name for p in typer.main.get_command(one).params]
    assert order == ["prompt", *MODEL, *SAMPLING, *MACHINE, *NGRAM, *POLICY, "suffix", "global_cache", "tree_width"]


def _own(own: Annotated[int, typer.Option("--own")] = 0) -> None:
    pass


def _own_and_params(own: Annotated[int, typer.Option("--own")] = 0, *, params) -> None:
    pass


@pytest.mark.parametrize("fn, order, retell", [
    (_own, ("own", "model"), {}),  # the right use, for contrast
    (_own, ("own", "modle"), {}),  # not a shared option
    (_own, ("model",), {}),  # its own option left out
    (_own, ("own", "model"), {"draft": Told("x")}),  # told but not taken
    (_own_and_params, ("own", "model", "temp"), {}),  # SamplingParams without all the sampling options
])
def test_takes_refuses_what_it_cannot_place(fn, order, retell):
    if order == ("own", "model") and not retell:
        assert takes(*order)(fn).shared == ("model",)
        return
    with pytest.raises(TypeError):
        takes(*order, **retell)(fn)
