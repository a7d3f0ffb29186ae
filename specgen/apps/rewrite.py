"""One-shot file rewriting as pure logic: input checks, the prompt, the atomic write.

The model is asked to write the new text inside a code fence that the prompt
has already opened, so the output starts with the text itself (prompt lookup
copies from the input at once) and ends where the model closes the fence.
Files are replaced by writing a temporary file in the same directory,
fsyncing it and renaming it over the target: at every instant the target is
either the old file or the complete new one.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specgen.apps.chat import ChatFormat, encode, render, segments, tokenize_segments
from specgen.errors import SpecgenError, read_file_bytes

STDIN = "-"


@dataclass
class Source:
    text: str
    name: str  # for messages and diff headers
    path: Path | None  # None for stdin


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text, or a SpecgenError saying why the bytes are not."""
    if b"\x00" in data:
        raise SpecgenError(f"{name} is a binary file (it contains NUL bytes): rewrite takes UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecgenError(
            f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): rewrite takes UTF-8 text"
        ) from None


def read_source(file: str, stdin_bytes=None, max_bytes: int | None = None) -> Source:
    """The file to rewrite ('-': stdin, read with `stdin_bytes()`).

    max_bytes: refuse larger input before reading it all (far beyond any
    context; the exact token count is checked once a tokenizer is loaded).
    """
    if file == STDIN:
        data = stdin_bytes() if stdin_bytes else b""
        _check_size(len(data), max_bytes, "stdin")
        return Source(decode_text(data, "stdin"), "stdin", None)
    path = Path(file)
    if max_bytes is not None and path.is_file():
        _check_size(path.stat().st_size, max_bytes, file)
    return Source(decode_text(read_file_bytes(path, "file"), file), file, path)


def max_bytes_for(n_ctx: int) -> int:
    """More bytes than any tokenizer packs into n_ctx tokens (they average ~4 a token)."""
    return 64 * n_ctx


def _check_size(size: int, max_bytes: int | None, name: str) -> None:
    if max_bytes is not None and size > max_bytes:
        raise SpecgenError(
            f"{name} is too large for the context: {size} bytes, far more than {max_bytes // 64} tokens hold "
            f"(raise -c/--ctx-size)"
        )


# -- where the result goes -----------------------------------------------------


@dataclass
class OutputPlan:
    path: Path | None  # None: stdout
    backup: Path | None = None
    mode: int | None = None  # permission bits for the new file
    in_place: bool = False


def _read_only(path: Path, st: os.stat_result) -> bool:
    # Mode bits as well as access(): root may write anything, but a file
    # marked read-only is not meant to be replaced.
    return not (st.st_mode & 0o222) or not os.access(path, os.W_OK)


def _check_dir_writable(d: Path, what: str) -> None:
    if not d.is_dir():
        raise SpecgenError(f"{what}: directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise SpecgenError(f"{what}: cannot create files in {d} (permission denied)")


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def check_options(file: str, output: str | None, in_place: bool, no_backup: bool) -> None:
    """Option combinations that make no sense, before anything is read."""
    if output and in_place:
        raise SpecgenError("choose one of -o/--output, --in-place")
    if no_backup and not in_place:
        raise SpecgenError("--no-backup only applies with --in-place")
    if in_place and file == STDIN:
        raise SpecgenError("--in-place needs a FILE, not stdin (use -o OUT)")


def plan_output(src: Source, output: str | None, in_place: bool, no_backup: bool) -> OutputPlan:
    """Check, before any model is loaded, that the result can be written."""
    check_options(STDIN if src.path is None else str(src.path), output, in_place, no_backup)
    if in_place:
        real = Path(os.path.realpath(src.path))  # replace a symlink's target, keep the link
        st = real.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SpecgenError(f"{src.name} is not a regular file: cannot replace it in place")
        if _read_only(real, st):
            raise SpecgenError(f"{src.name} is read-only: not rewriting it in place")
        _check_dir_writable(real.parent, f"--in-place {src.name}")
        backup = None if no_backup else real.with_name(real.name + ".bak")
        if backup is not None and backup.exists() and (backup.is_dir() or _read_only(backup, backup.stat())):
            raise SpecgenError(f"cannot replace the backup {backup}: it is a directory or read-only (or use --no-backup)")
        return OutputPlan(real, backup, stat.S_IMODE(st.st_mode), in_place=True)
    if not output:
        return OutputPlan(None)
    out = Path(output)
    if out.is_dir():
        raise SpecgenError(f"-o {output} is a directory")
    if src.path is not None and out.exists() and os.path.samefile(out, src.path):
        raise SpecgenError(f"-o {output} is FILE itself: use --in-place to replace it (with a backup)")
    if out.exists():
        st = out.stat()
        if _read_only(out, st):
            raise SpecgenError(f"-o {output} is read-only")
        mode = stat.S_IMODE(st.st_mode)
    else:
        mode = _umask_mode()
    _check_dir_writable(out.parent if str(out.parent) else Path("."), f"-o {output}")
    return OutputPlan(out, None, mode)


# -- the prompt ------------------------------------------------------------------


@dataclass
class RewritePrompt:
    tokens: list[int]
    stop: str  # the fence that closes the output, after a newline
    content_tokens: int  # the file's own size in tokens


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in the text (as CommonMark)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _fenced(text: str, fence: str) -> str:
    return f"{fence}\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{fence}"


def prompt_text(instruction: str, content: str, fmt: ChatFormat | None) -> tuple[str, str]:
    """(prompt, fence): the model continues right after an opened fence."""
    fence = fence_for(content)
    if fmt is None:
        body = f"{instruction}\n\nOriginal:\n{_fenced(content, fence)}\n\nRewritten:\n{fence}\n"
        return body, fence
    user = f"{instruction}\n\nReply with the rewritten text only, in a code block.\n\n{_fenced(content, fence)}"
    return render(fmt, [{"role": "user", "content": user}]) + f"{fence}\n", fence


def build_prompt(tok, instruction: str, content: str, fmt: ChatFormat | None) -> RewritePrompt:
    """Tokens of the rewrite prompt; the file's text is never parsed for control tokens."""
    if not instruction.strip():
        raise SpecgenError("empty instruction: -i/--instruction says what to do with the file")
    text, fence = prompt_text(instruction, content, fmt)
    if fmt is None:
        parts = segments(text, [content] if content else [])
        info = tok.vocab_info()
        tokens = tokenize_segments(tok, parts)
        if info.add_bos and info.bos >= 0:
            tokens = [info.bos] + tokens
    else:
        tokens = encode(tok, text, [content] if content else [])
    n_content = len(tok.tokenize(content, add_special=False, parse_special=False)) if content else 0
    return RewritePrompt(tokens, "\n" + fence, n_content)


def check_fits(p: RewritePrompt, n_ctx: int, name: str) -> None:
    """Room for the prompt and a rewrite about as long as the file."""
    need = len(p.tokens) + p.content_tokens + 8
    if need > n_ctx:
        raise SpecgenError(
            f"{name} is too large for the context: it has {p.content_tokens} tokens, and the prompt "
            f"({len(p.tokens)} tokens) plus a rewrite of that length needs about {need}, "
            f"but the context holds {n_ctx} (raise -c/--ctx-size)"
        )


def default_max_tokens(p: RewritePrompt, n_ctx: int) -> int:
    return max(16, min(n_ctx - len(p.tokens) - 1, 2 * p.content_tokens + 64))


def finish_text(output: str, original: str) -> str:
    """The new file's text: ends with a newline exactly when the original did.

    (The newline before the closing fence belongs to the fence.)
    """
    out = output
    if original.endswith("\n") and not out.endswith("\n"):
        out += "\n"
    elif not original.endswith("\n") and original and out.endswith("\n"):
        out = out[:-1]
    return out


# -- writing -----------------------------------------------------------------------


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_backup(path: Path, backup: Path) -> None:
    """backup := the current file, atomically (a hard link; a synced copy if links fail)."""
    tmp = backup.with_name(f".{backup.name}.{os.getpid()}.specgen-tmp")
    try:
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copy2(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, backup)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes, *, backup: Path | None = None, mode: int | None = None) -> None:
    """Replace `path` with `data` so that a crash at any moment leaves old or new, whole.

    Temporary file in the same directory (so the rename stays on one file
    system), written and fsynced, then `os.replace`d over the target; the
    directory is fsynced so the rename itself survives a power cut.
    """
    path = Path(path)
    d = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".specgen-tmp", dir=d)
    except OSError as exc:
        raise SpecgenError(f"cannot create a temporary file in {d}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if backup is not None and path.exists():
            _make_backup(path, backup)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise SpecgenError(f"cannot write {path}: {exc.strerror or exc} (left unchanged)") from None
        raise
    _fsync_dir(d)


def unified_diff(old: str, new: str, name: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{name}", tofile=f"b/{name}"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def draft_share(accepted: int, generated: int) -> float:
    """Share of the output that came from accepted drafts."""
    return accepted / generated if generated else 0.0

