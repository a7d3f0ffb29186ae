"""The one exception type the CLI turns into a single clear line on stderr."""


class SpecgenError(Exception):
    """A user-facing error: bad input, a missing model, an impossible request.

    The message is one line, says what is wrong and, where it can, what to do.
    """


def read_file_bytes(path, what: str) -> bytes:
    """A file's bytes; every way reading can fail is one SpecgenError line.

    `what` names the file for the user ("prompt file", "request file", …).
    """
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SpecgenError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise SpecgenError(f"{what} is a directory: {path}") from None
    except OSError as exc:
        raise SpecgenError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_text_file(path, what: str) -> str:
    """A UTF-8 text file's content, or one SpecgenError line."""
    try:
        return read_file_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise SpecgenError(f"{what} is not UTF-8 text: {path}") from None
