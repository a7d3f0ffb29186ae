"""The one exception type the CLI turns into a single clear line on stderr."""


class SpecgenError(Exception):
    """A user-facing error: bad input, a missing model, an impossible request.

    The message is one line, says what is wrong and, where it can, what to do.
    """


def read_text_file(path, what: str) -> str:
    """A UTF-8 text file's content; every way it can fail is one SpecgenError line.

    `what` names the file for the user ("prompt file", "request file", …).
    """
    try:
        return open(path, "rb").read().decode("utf-8")
    except FileNotFoundError:
        raise SpecgenError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise SpecgenError(f"{what} is a directory: {path}") from None
    except UnicodeDecodeError:
        raise SpecgenError(f"{what} is not UTF-8 text: {path}") from None
    except OSError as exc:
        raise SpecgenError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
