"""Small helpers shared by the command-line scripts."""

from __future__ import annotations

import sys
from typing import Callable

from r3rag.errors import R3RagError


def run_main(main: Callable[[], int | None]) -> None:
    """Run a CLI ``main``: a user error prints one ``error: ...`` line and exits 2."""
    try:
        code = main()
    except R3RagError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
