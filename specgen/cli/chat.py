"""`specgen chat`: reading turns, driving each reply's generation, the notes on stderr.

The logic lives in specgen.apps.chat; the printing in render.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import specgen.cli.render as render
from specgen.cli.options import (
    MACHINE, MODEL, NGRAM, SAMPLING, Told, check_max_tokens, global_cache_on, takes,
)
from specgen.errors import SpecgenError
from specgen.plan import Kind, default_k
from specgen.policy.base import FixedK

CHAT_TOLD = dict(
    max_tokens=Told("Tokens per reply at most.", 512),
    temp=Told("Temperature; 0 = greedy. 0.7 keeps a small model from looping; --seed makes it reproducible.", 0.7),
    json_out=Told("When stdout is not a terminal: one JSON object per turn on stdout (the reply and its numbers, as run --json), nothing else."),
)


def _make_policy(loaded, k: int, fixed: bool, draft_engine, heads: bool = False):
    """The loop's draft-length policy: exactly k (-k, /k) or the loader's adaptive one up to k
    (heads: priced by the heads' timed step)."""
    from specgen.session import make_policy

    heads_s = loaded.heads_step_s if heads else None
    # the session's cost log: what earlier turns timed prices this one, and is kept at close
    return make_policy("fixed" if fixed else loaded.policy_name, k, loaded.target, draft_engine, heads_step_s=heads_s,
                       heads=loaded.heads if heads else None, log=loaded.costs_seen)


def stats_table(st, mode: str, k: int, policy):
    return render.stats_table(st, mode, k, render.policy_name(policy))


# -- chat ----------------------------------------------------------------------------


@dataclass
class _ChatState:
    """What the slash commands change: speculation on or off, which drafter, k, and the policy."""

    loaded: object  # the loader's models
    model_drafter: object  # the draft model's drafter, None without -d
    lookup_drafter: object  # the model-free drafter: prompt lookup, or the suffix index (--suffix)
    spec: bool
    use_lookup: bool
    k: int
    fixed_k: bool  # -k or /k given: exactly k a round; else the loader's policy up to k
    policy: object = None
    free_mode: Kind = Kind.LOOKUP  # what lookup_drafter is: LOOKUP | SUFFIX

    def mode(self) -> Kind:
        return Kind.PLAIN if not self.spec else self.free_mode if self.use_lookup else self.loaded.mode

    def free_label(self) -> str:
        return "prompt lookup" if self.free_mode is Kind.LOOKUP else "the suffix index"

    def drafter(self):
        return (self.lookup_drafter if self.use_lookup else self.model_drafter) if self.spec else None

    def k_label(self) -> str:
        return render.k_label(self.k, self.policy)

    def new_policy(self) -> None:
        # One policy for the session: its acceptance estimates carry across turns.
        engine = None if self.use_lookup else self.loaded.draft_engine
        heads = not self.use_lookup and self.loaded.mode is Kind.HEADS
        self.policy = _make_policy(self.loaded, self.k, self.fixed_k, engine, heads) if self.spec else None


def _command(cmd, state: _ChatState, conv, session, n_ctx: int, system: str | None) -> bool:
    """Carry out a slash command; False when it ends the chat."""
    from specgen.apps.chat import HELP

    note = render.note
    if cmd.name == "exit":
        return False
    if cmd.name == "help":
        for usage, what in HELP:
            note(f"  {usage:<14} {what}")
    elif cmd.name == "stats":
        render.stderr_console().print(stats_table(session, state.mode(), state.k, state.policy))
        note(f"turns {conv.turns} · context {len(conv.tokens)}/{n_ctx} tokens")
    elif cmd.name == "k":
        state.k, state.fixed_k = cmd.arg, True
        state.new_policy()
        note(f"drafting {state.k} tokens per round" + ("" if state.spec else " (speculation is off: /spec on)"))
    elif cmd.name == "spec":
        state.spec = cmd.arg
        state.new_policy()
        note(f"speculative decoding {'on: ' + state.mode() + ' ' + state.k_label() if state.spec else 'off: plain decoding'}")
    elif cmd.name == "lookup":
        if state.use_lookup and state.model_drafter is not None:
            state.use_lookup = False
            note(f"drafting with the draft model {state.loaded.draft_path.name}" if state.loaded.draft_path
                 else "drafting with the prediction heads")
        elif state.use_lookup and state.spec:
            note(f"already drafting by {state.free_label()}")
        else:
            state.use_lookup = True
            note(f"drafting by {state.free_label()}")
        state.spec = True
        state.new_policy()
    elif cmd.name == "reset":
        conv.reset()
        note("conversation reset" + (" (the system prompt stays)" if system else ""))
    return True


def _follow_with_status(gen, stream) -> bool:
    """A reply, streamed, with run's live status line on a terminal's stderr, cleared before the next prompt."""
    status = render.StatusLine()
    start = time.perf_counter()
    status.start()
    try:
        return render.follow(gen, stream, lambda st, r: status.show(render.round_status(st, r, time.perf_counter() - start)))
    finally:
        status.stop()


def _read_line(interactive: bool) -> str | None:
    """One line of input, None at end of input (Ctrl-D)."""
    if interactive:
        sys.stderr.write("\x1b[1m>\x1b[0m " if render.colour_enabled(sys.stderr) else "> ")
        sys.stderr.flush()
        try:
            return input()
        except EOFError:
            sys.stderr.write("\n")
            return None
    line = sys.stdin.readline() if sys.stdin is not None else ""
    return None if line == "" else line.rstrip("\r\n")


def base_model_note(model: str, fmt_name: str) -> str:
    """chat's one line on a model whose GGUF has no chat template (--template auto)."""
    return (f"{model} has no chat template in its GGUF: a base model, it completes text and was not tuned to chat; "
            f"replies go through the {fmt_name} template, which it never learned (an instruct model chats: "
            f"the default smollm2-135m; --template picks one)")


@takes("system", *MODEL, "max_tokens", *SAMPLING, *MACHINE, *NGRAM, "template", "suffix", "global_cache", "json_out", **CHAT_TOLD)
def chat(
    *, opts, params, system, max_tokens, temp, seed, draft_max, ngram_max, ngram_min, template, suffix, global_cache, json_out,
) -> None:
    """Chat with the model. One turn per line when stdin is piped; /help lists commands."""
    from specgen.apps.chat import ContextFull, Conversation, format_for, message_text, parse_command
    from specgen.decode.stats import Stats
    from specgen.engine.llama import common_prefix
    from specgen.session import open_session

    note = render.note
    check_max_tokens(max_tokens)
    params.validate()
    global_cache_on(global_cache, suffix)
    opts.validate()
    json_turns = json_out and not sys.stdout.isatty()
    if json_out and not json_turns:
        note("--json: stdout is a terminal, so the replies are shown as text")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
    loaded = open_session(opts)
    render.note_translated(loaded.translated)
    try:
        target = loaded.target
        fmt = format_for(target, template)
        if template in (None, "auto") and not target.chat_template():
            note(base_model_note(loaded.target_path.name, fmt.name))
        conv = Conversation(fmt, target, system)
        plan = loaded.plan
        model_drafter = loaded.drafter if plan.kind.with_model else None
        state = _ChatState(
            loaded, model_drafter,
            lookup_drafter=loaded.drafter if plan.kind.free else loaded.new_drafter(plan.free_drafting()),
            spec=plan.kind is not Kind.PLAIN,
            use_lookup=model_drafter is None,
            # plain (--no-spec): the k /spec on drafts with
            k=plan.k or default_k(Kind.LOOKUP, "fixed"),
            fixed_k=draft_max is not None,
            free_mode=Kind.SUFFIX if plan.kind is Kind.SUFFIX else Kind.LOOKUP,
        )
        state.new_policy()
        session = Stats()
        if interactive:
            note(
                f"specgen chat · {loaded.target_path.name} · template {fmt.name} · {state.mode()}"
                f"{' ' + state.k_label() if state.spec else ''} · temp {temp:g} · /help for commands, Ctrl-D quits"
            )
        turn = 0
        while True:
            try:
                line = _read_line(interactive)
            except KeyboardInterrupt:
                sys.stderr.write("\n")
                note("(Ctrl-D or /exit quits)")
                continue
            if line is None:
                break
            if not line.strip():
                continue
            try:
                cmd = parse_command(line)
            except SpecgenError as exc:
                note(str(exc))
                continue
            if cmd is not None:
                if not _command(cmd, state, conv, session, target.n_ctx, system):
                    break
                continue

            conv.add_user(message_text(line))
            reserve = min(max_tokens, target.n_ctx // 4)
            try:
                prompt, dropped = conv.fit(target.n_ctx, reserve)
            except ContextFull as exc:
                conv.drop_pending_user()
                note(str(exc))
                continue
            if dropped:
                note(f"context nearly full: dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to make room (/reset starts afresh)")
            cached = min(common_prefix(target.kv_tokens(0), prompt), len(prompt) - 1)
            turn_params = replace(params, seed=seed + turn) if seed is not None else params
            drafter = state.drafter()
            stream = render.TextStream(target, None if json_turns else sys.stdout, fmt.stop)
            try:
                gen = loaded.generate(prompt, max_tokens=min(max_tokens, target.n_ctx - len(prompt)),
                                      params=turn_params, drafter=drafter, k=state.k if drafter else 0,
                                      policy=state.policy if drafter else FixedK())
                interrupted = _follow_with_status(gen, stream)
            except SpecgenError as exc:  # a failed reply ends the turn, not the chat
                if not json_turns:
                    sys.stdout.write("\n")
                conv.drop_pending_user()
                note(f"error: {exc}")
                continue
            turn += 1
            if json_turns:
                obj = render.generation_json(stream.text, gen.tokens, state.mode(), gen.stats, state.k if drafter else 0,
                                             render.policy_name(state.policy if drafter else None))
                render.write_json({"turn": turn, **obj})
            elif not "".join(stream.written).endswith("\n"):
                sys.stdout.write("\n")  # one reply, one or more whole lines
                sys.stdout.flush()
            if interrupted and not gen.tokens:
                conv.drop_pending_user()
            else:
                conv.add_reply(stream.text, prompt, list(gen.tokens))
            st = gen.stats
            session.merge(st)
            note(render.reply_status(st, state.mode(), state.k_label(), len(prompt) - cached, cached))
            used = len(conv.tokens)
            if st.stop_reason == "context_full" or used + reserve > target.n_ctx:
                note(
                    f"context {render.pct(used / target.n_ctx)} full ({used}/{target.n_ctx} tokens): "
                    f"the oldest turns will be dropped to make room; /reset starts afresh"
                )
    except BrokenPipeError:
        render.hang_up()
    finally:
        loaded.close()
