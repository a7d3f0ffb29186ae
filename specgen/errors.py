"""The one exception type the CLI turns into a single clear line on stderr."""


class SpecgenError(Exception):
    """A user-facing error: bad input, a missing model, an impossible request.

    The message is one line, says what is wrong and, where it can, what to do.
    """
