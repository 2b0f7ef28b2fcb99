"""Small helpers shared by the command-line scripts.

Every script builds its parser with :class:`ArgumentParser` and wraps ``main`` in
:func:`run_main`, so that a bad flag and a user error both end in one ``error: ...`` line on
stderr with exit status 2, never a stack trace.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn

from r3rag.errors import R3RagError


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: PROG: MESSAGE (see PROG --help)``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def run_main(main: Callable[[], int | None]) -> None:
    """Run a CLI ``main``: a user error prints one ``error: ...`` line and exits 2 (or the error's
    own ``exit_code``: 3 for an evaluation a service failed)."""
    try:
        code = main()
    except R3RagError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 2))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
