"""OpenRLHF's own argument parser applied to a launch script's flags (the CI flag contract).

OpenRLHF 0.11 builds its parser inside ``if __name__ == "__main__":`` of
``openrlhf.cli.train_ppo_ray``, so it cannot be imported. :func:`parse_with_openrlhf` runs that
block as ``__main__`` with the given argv and stops it at the first line of ``train(args)``
(``ray.is_initialized``), after OpenRLHF parsed the flags *and* ran its own validation
(estimator/critic rules, batch-size assertions). A renamed or removed flag is an argparse error
(exit status 2), a failed validation an ``AssertionError``; either is reported as
:class:`FlagError` with OpenRLHF's message.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from typing import Any

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"


class FlagError(Exception):
    """OpenRLHF rejected the flags."""


class _Parsed(Exception):
    pass


def parse_with_openrlhf(argv: list[str], module: str = OPENRLHF_MAIN) -> Any:
    """The hierarchical ``args`` namespace OpenRLHF would train with, after its validation."""
    import ray

    import openrlhf.utils.config as cfg

    captured: dict[str, Any] = {}
    orig_hier, orig_is_init = cfg.hierarchize, ray.is_initialized

    def hierarchize(args: Any) -> Any:
        captured["args"] = orig_hier(args)
        return captured["args"]

    def stop(*_: Any, **__: Any) -> bool:
        raise _Parsed()

    old_argv, err = sys.argv, io.StringIO()
    cfg.hierarchize, ray.is_initialized = hierarchize, stop
    sys.argv = [module] + list(argv)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(module, run_name="__main__")
    except _Parsed:
        return captured["args"]
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise FlagError(lines[-1] if lines else f"argparse exited with status {exc.code}") from None
    except AssertionError as exc:
        raise FlagError(f"OpenRLHF validation: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - its validation code failing on the flags is a rejection too
        raise FlagError(f"OpenRLHF failed on these flags: {type(exc).__name__}: {exc}") from None
    finally:
        cfg.hierarchize, ray.is_initialized = orig_hier, orig_is_init
        sys.argv = old_argv
    raise FlagError("OpenRLHF's main returned without reaching train(args)")


def openrlhf_parser(module: str = OPENRLHF_MAIN) -> Any:
    """OpenRLHF's own ``argparse.ArgumentParser`` (built by its ``__main__`` block, stopped at
    ``parse_args``), to read its choices and defaults instead of copying them."""
    import argparse

    captured: dict[str, Any] = {}
    orig = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *_: Any, **__: Any) -> Any:
        captured["parser"] = self
        raise _Parsed()

    old_argv = sys.argv
    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign]
    sys.argv = [module]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(module, run_name="__main__")
    except _Parsed:
        return captured["parser"]
    finally:
        argparse.ArgumentParser.parse_args = orig  # type: ignore[method-assign]
        sys.argv = old_argv
    raise FlagError(f"{module} built no argument parser")


def option(parser: Any, flag: str) -> Any:
    """The ``argparse.Action`` of ``flag`` (``"--algo.advantage.estimator"``) in ``parser``."""
    for action in parser._actions:
        if flag in action.option_strings:
            return action
    raise FlagError(f"OpenRLHF has no flag {flag}")


def get(args: Any, dotted: str) -> Any:
    """``get(args, "algo.advantage.estimator")`` on OpenRLHF's hierarchical namespace."""
    node = args
    for part in dotted.split("."):
        node = getattr(node, part)
    return node
