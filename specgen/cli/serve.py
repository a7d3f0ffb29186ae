"""`specgen serve`: the OpenAI-compatible HTTP server (specgen.serve) on the command line.

Loads the models with --parallel sequences in one context, starts the engine
thread and serves HTTP on --host:--port until SIGINT/SIGTERM, then stops
accepting, lets running requests finish for --grace seconds, and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
from specgen.cli.options import MACHINE, MODEL, NGRAM, POLICY, SAMPLING, Told, global_cache_on, takes

API_KEY_ENV = "SPECGEN_API_KEY"
SERVE_TOLD = dict(
    max_tokens=Told("Default max_tokens of a request that gives none."),
    template=Told("Chat template: auto (default), gguf, gemma, plain or a Jinja file."),
)


@takes(*MODEL, "max_tokens", *SAMPLING, "ignore_eos", *MACHINE, *NGRAM, *POLICY, "host", "port", "parallel", "queue", "api_key",
       "grace", "template", "suffix", "global_cache", "prompt_cache", "cache_ram", **SERVE_TOLD)
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free port, printed at start).")] = 8080,
    parallel: Annotated[int, typer.Option("-np", "--parallel", help="Requests decoded together (slots of one context).")] = 4,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait for a slot; beyond it, 503 + Retry-After.")] = 64,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help=f"Require 'Authorization: Bearer KEY' (or set {API_KEY_ENV}).")] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds running requests may take to finish after SIGINT/SIGTERM.")] = 10.0,
    prompt_cache: Annotated[bool, typer.Option(
        "--prompt-cache/--no-prompt-cache",
        help="Keep a finished request's cache in its slot; a prompt that shares its prefix prefills only the rest "
             "(multi-turn chat resends the whole history).")] = True,
    cache_ram: Annotated[int, typer.Option(
        "--cache-ram", metavar="MIB",
        help="Host memory for slot caches saved when their slot is reused, loaded again for a prompt that shares "
             "their prefix (0: slots only).")] = 1024,
    *, opts, params, model, pair, max_tokens, ignore_eos, template, suffix, global_cache,
) -> None:
    """Serve the OpenAI API (chat and completions) with speculative decoding and continuous batching."""
    from specgen.apps.chat import format_for
    from specgen.errors import SpecgenError
    from specgen.serve.http.app import AppConfig, create_app, http_server, listen
    from specgen.serve.http.loop import EngineLoop
    from specgen.serve.http.schema import Defaults
    from specgen.serve.setup import open_serving

    if max_tokens < 1:
        raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {max_tokens})")
    if cache_ram < 0:
        raise SpecgenError(f"--cache-ram must be >= 0 MiB (got {cache_ram})")
    if queue < 0:
        raise SpecgenError(f"--queue must be >= 0 (got {queue})")
    if not 0 <= port <= 65535:
        raise SpecgenError(f"--port must be in 0..65535 (got {port})")
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    params.validate()
    global_cache_on(global_cache, suffix)
    opts.validate()
    con = render.stderr_console()
    sock = listen(host, port)  # before loading: a taken port fails at once
    serving = engine = None
    try:
        serving = open_serving(opts, parallel, prompt_cache=prompt_cache,
                               cache_ram_mib=cache_ram)
        render.note_translated(serving.session.translated)
        try:
            fmt = format_for(serving.target, template)
        except SpecgenError:
            if template:
                raise
            fmt = None  # no usable template: /v1/chat/completions says so
        engine = EngineLoop(serving.new_server, serving.target, parallel=parallel, queue_max=queue)
        defaults = Defaults(params, max_tokens, str(serving.session.mode), serving.session.draft_max, serving.session.policy_name)
        aliases = tuple(a for a in (model, pair) if a and a != "auto")
        cfg = AppConfig(serving.model_id, defaults, fmt, aliases, api_key)
        app = create_app(engine, cfg)
        engine.start()
        bound = sock.getsockname()
        k = f" k≤{serving.session.draft_max} ({serving.session.policy_name})" if serving.session.draft_max else ""
        k += " · global index over earlier requests" if opts.global_cache else ""
        con.print(
            f"specgen serve: {serving.model_id} · {serving.session.mode}{k} · {parallel} slots, queue {queue}"
            f"{'' if prompt_cache else ' · no prompt cache'}"
            f"{' · API key required' if api_key else ''}", highlight=False,
        )
        con.print(f"listening on http://{bound[0]}:{bound[1]}/v1", highlight=False)
        sys.stderr.flush()
        server = http_server(app, grace=grace)
        # uvicorn re-raises the signal it caught once it has shut down; these
        # handlers take it, so a requested shutdown exits 0.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run(sockets=[sock])
        con.print("specgen serve: stopped", highlight=False)
    finally:
        if engine is not None:
            engine.close(grace=0.0)  # uvicorn already gave running responses their grace
        if serving is not None:
            serving.close()
        sock.close()
