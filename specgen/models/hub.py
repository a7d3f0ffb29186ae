"""Hugging Face downloads that fail fast: a file from the shared HF cache, else the hub.

A host that cannot be reached at all (unknown name, refused, no route) fails at
once with one line (`HubUnreachable`); timeouts and HTTP 5xx keep the hub's own
retries, silently. The hub's logging and warnings stay off stderr unless
$SPECGEN_HF_LOG is set.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import warnings
from pathlib import Path

from specgen.errors import SpecgenError


def hf_file(repo: str, file: str, revision: str | None, *, download: bool, ref: str) -> Path:
    """The local path of repo/file@revision: the cache first (works offline), then a download
    unless `download` is off; every failure is one SpecgenError line naming `ref`."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise SpecgenError("huggingface_hub is not installed: pip install huggingface-hub") from None
    what = f"{repo}/{file}" + (f"@{revision}" if revision else "")
    with quiet_hub():
        try:
            # Cache first: no network round trip, and it works offline.
            return Path(hf_hub_download(repo, file, revision=revision, local_files_only=True))
        except Exception:
            pass
        if not download:
            raise SpecgenError(f"{what} is not downloaded yet (run `specgen pull {ref}`)")
        try:
            return Path(hf_hub_download(repo, file, revision=revision))
        except Exception as e:
            raise SpecgenError(f"could not download {what}: {hf_reason(e)}") from None


class HubUnreachable(Exception):
    """The hub's host cannot be reached at all (unknown name, refused, no route).

    Deliberately not an HTTP-library error: huggingface_hub retries those with
    backoff (≈ 23 s), and retrying cannot fix a missing network.
    """


def unreachable_reason(exc: BaseException | None) -> str | None:
    """Why a connection failed, when no retry can help; None for what may pass (timeouts, resets)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, socket.gaierror):
            return "host name not resolved"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "no route to host"
        exc = exc.__cause__ or exc.__context__
    return None


def _fail_fast(make_client):
    """Wrap a huggingface_hub client factory: unreachable hosts raise HubUnreachable at once."""

    def factory():
        client = make_client()
        send = client.send

        def send_or_fail_fast(request, **kwargs):
            try:
                return send(request, **kwargs)
            except Exception as e:
                why = unreachable_reason(e)
                if why is None:
                    raise  # timeouts and resets: the hub's own retries apply
                port = f":{request.url.port}" if request.url.port else ""
                raise HubUnreachable(f"cannot reach {request.url.host}{port} ({why})") from None

        client.send = send_or_fail_fast  # client.request and client.stream both go through send
        return client

    return factory


@contextlib.contextmanager
def quiet_hub():
    """huggingface_hub with fail-fast connections and, unless $SPECGEN_HF_LOG is set, no logs or warnings.

    Its retries for timeouts and HTTP 5xx stay, silently. Its download progress
    bar stays too: tqdm shows it only when stderr is a terminal.
    """
    from huggingface_hub.utils import _http as hub_http

    previous = getattr(hub_http, "_GLOBAL_CLIENT_FACTORY", None)
    set_factory = getattr(hub_http, "set_client_factory", None)  # huggingface_hub >= 1.0
    if previous is not None and set_factory is not None:
        set_factory(_fail_fast(previous))
    verbose = bool(os.environ.get("SPECGEN_HF_LOG"))
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    try:
        with warnings.catch_warnings():
            if not verbose:
                logger.setLevel(logging.CRITICAL + 1)
                warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        if previous is not None and set_factory is not None:
            set_factory(previous)


def hf_reason(e: Exception) -> str:
    names = {c.__name__ for c in type(e).__mro__}
    if "GatedRepoError" in names:
        return "the repository is gated: accept its terms on huggingface.co, then `hf auth login`"
    if "RepositoryNotFoundError" in names:
        return "repository not found (or private: log in with `hf auth login`)"
    if "RevisionNotFoundError" in names:
        return "revision not found in the repository"
    # LocalEntryNotFoundError subclasses EntryNotFoundError: it means "hub unreachable".
    if "EntryNotFoundError" in names and "LocalEntryNotFoundError" not in names:
        return "no such file in the repository"
    if hf_offline():
        return "offline mode (HF_HUB_OFFLINE is set) and nothing cached"
    if isinstance(e, HubUnreachable):
        return f"{e}; nothing cached (check the network, or HF_ENDPOINT / HF_HUB_OFFLINE)"
    cause = e.__cause__ or e
    line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    if len(line) > 160:
        line = line[:157] + "..."
    return f"{line}; nothing cached (check the network, or HF_ENDPOINT / HF_HUB_OFFLINE)"


def hf_offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False
