"""The one exception type for a user's mistake (bad path, malformed file, unknown name).

Entry points print it as ``error: <message>`` on one line, without a traceback, and exit with code 2
(see ``pasta.cli``). Raise it with one clear line that says what is wrong and how to fix it.
"""


class PastaError(Exception):
    """A user's mistake: printed as one line by the entry points, exit code 2."""
