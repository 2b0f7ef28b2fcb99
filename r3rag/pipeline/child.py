"""Run a stage's program as a child process that never outlives the pipeline.

A training stage (cold start, SFT, RL) is its own program. Three ways the pipeline can end
must not leave it running, holding cores and writing into the work folder:

- the stage fails or the user presses Ctrl-C: :func:`run_child` (one program) or
  :func:`run_children` (several at once: an evaluation's shards) terminates it (SIGTERM, then
  SIGKILL after a grace period) before the exception travels on;
- SIGTERM to the pipeline: the pipeline turns it into an exception (see
  :mod:`r3rag.pipeline.runner`), and the case above applies;
- SIGKILL to the pipeline (nothing of ours runs): the program is started under a small
  supervisor, this module's ``__main__``, which leads the program's process group and asks Linux
  (``prctl(PR_SET_PDEATHSIG, SIGUSR1)``) to signal it when the pipeline dies; it then kills the
  whole group, so the program's own children (LLaMA-Factory under ``train/sft.py``) go too. A
  SIGTERM to the group (the first step of the stop above) is left to the program: the supervisor
  keeps waiting and exits with the program's status. Without ``prctl`` (not Linux) only the
  pipeline's own cleanup applies.

The child's output goes to the terminal and, line by line, to ``log_path``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Sequence

from r3rag.errors import R3RagError

PR_SET_PDEATHSIG = 1
#: bytes of one line of a stage program's output shown on the console (its log keeps all)
CONSOLE_LINE_LIMIT = 400


class ChildFailed(R3RagError):
    """A stage's program exited with a non-zero status."""


def _set_parent_death_signal(sig: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipeline's own cleanup is all there is
        pass


class ClippedLines:
    r"""A console sink that shows at most ``limit`` bytes of each line (``\n`` or ``\r`` ends one,
    so progress bars still redraw), then one marker; the log file beside it gets everything.
    LLaMA-Factory, for one, prints a tokenised example as two lines of several thousand ids.

    >>> import io
    >>> out = io.BytesIO(); c = ClippedLines(out, 5, "LOG")
    >>> c.write(b"abcdefgh\nxy"); c.write(b"z\r12"); out.getvalue()
    b'abcde ... [line cut; whole in LOG]\nxyz\r12'
    """

    def __init__(self, sink: IO[bytes], limit: int, where: str) -> None:
        self.sink, self.limit, self.n = sink, limit, 0
        self.marker = f" ... [line cut; whole in {where}]".encode()

    def write(self, chunk: bytes) -> None:
        out = bytearray()
        for piece in re.split(rb"([\r\n])", chunk):
            if piece in (b"\r", b"\n"):
                out += piece
                self.n = 0
                continue
            if self.n < self.limit:
                out += piece[: self.limit - self.n]
            if self.n <= self.limit < self.n + len(piece):
                out += self.marker
            self.n += len(piece)
        self.sink.write(bytes(out))

    def flush(self) -> None:
        self.sink.flush()


def _pump(src: IO[bytes], sinks: list[IO[bytes]]) -> None:
    for chunk in iter(lambda: src.read1(65536) if hasattr(src, "read1") else src.read(65536), b""):
        for s in sinks:
            try:
                s.write(chunk)
                s.flush()
            except (OSError, ValueError):
                pass


def _start(cmd: Sequence[str], log_path: str | Path | None, cwd: str | Path | None, env: dict[str, str] | None,
           echo: bool) -> tuple[subprocess.Popen, threading.Thread, IO[bytes] | None]:
    """Start ``cmd`` under the supervisor, its output pumped to the console (if ``echo``) and the log."""
    full_env = dict(os.environ if env is None else env)
    full_env["R3RAG_PIPELINE_PARENT"] = str(os.getpid())
    shim = [sys.executable, "-m", "r3rag.pipeline.child", "--", *cmd]
    log = Path(log_path).open("ab") if log_path is not None else None
    console = getattr(sys.stdout, "buffer", None) if echo else None
    if console is not None and log_path is not None:
        console = ClippedLines(console, CONSOLE_LINE_LIMIT, str(log_path))  # type: ignore[assignment]
    sinks: list[IO[bytes]] = [s for s in (console, log) if s is not None]
    if echo:
        sys.stdout.flush()  # what this process printed comes before the child's output
    proc = subprocess.Popen(shim, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    pump = threading.Thread(target=_pump, args=(proc.stdout, sinks), daemon=True)
    pump.start()
    return proc, pump, log


def _failed(cmd: Sequence[str], rc: int, seconds: float, log_path: str | Path | None) -> ChildFailed:
    where = f"; its output is in {log_path}" if log_path is not None else ""
    return ChildFailed(f"{' '.join(str(c) for c in cmd[:3])} ... exited with status {rc} after {seconds:.0f} s{where}")


def run_child(
    cmd: Sequence[str],
    log_path: str | Path | None = None,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    echo: bool = True,
    grace_s: float = 10.0,
) -> None:
    """Run ``cmd`` to completion; raise :class:`ChildFailed` on a non-zero exit or a timeout.

    Any exception while waiting (KeyboardInterrupt, the pipeline's SIGTERM exception) stops the
    child first: SIGTERM to its process group, SIGKILL after ``grace_s`` seconds."""
    proc, pump, log = _start(cmd, log_path, cwd, env, echo)
    start = time.monotonic()
    try:
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc, grace_s)
            raise ChildFailed(f"{cmd[0] if cmd else '?'} ran past its {timeout_s:.0f} s limit and was stopped") from None
    except BaseException:
        _stop(proc, grace_s)
        raise
    finally:
        pump.join(timeout=5)
        if log is not None:
            log.close()
    if rc != 0:
        raise _failed(cmd, rc, time.monotonic() - start, log_path)


def run_children(
    cmds: Sequence[Sequence[str]],
    log_paths: Sequence[str | Path | None] | None = None,
    cwd: str | Path | None = None,
    envs: Sequence[dict[str, str] | None] | None = None,
    echo: Sequence[bool] | bool = True,
    grace_s: float = 10.0,
    poll_s: float = 0.2,
) -> None:
    """Run several programs at the same time (the shards of one evaluation) until all have exited.

    The first one to fail stops the others and raises :class:`ChildFailed` naming it; any exception
    while waiting (Ctrl-C, the pipeline's SIGTERM exception) stops all of them before it travels on.
    ``echo`` may be one flag for all or one per program (so that one progress bar shows)."""
    n = len(cmds)
    logs = list(log_paths) if log_paths is not None else [None] * n
    env_list = list(envs) if envs is not None else [None] * n
    echoes = [echo] * n if isinstance(echo, bool) else list(echo)
    if not (len(logs) == len(env_list) == len(echoes) == n):
        raise ValueError("run_children: one log path, env and echo flag per command")
    started: list[tuple[subprocess.Popen, threading.Thread, IO[bytes] | None]] = []
    start = time.monotonic()
    try:
        for cmd, log_path, env, e in zip(cmds, logs, env_list, echoes):
            started.append(_start(cmd, log_path, cwd, env, e))
        running = set(range(n))
        while running:
            for i in sorted(running):
                rc = started[i][0].poll()
                if rc is None:
                    continue
                running.discard(i)
                if rc != 0:  # the handler below stops the others
                    raise _failed(cmds[i], rc, time.monotonic() - start, logs[i])
            if running:
                time.sleep(poll_s)
    except BaseException:
        for proc, _, _ in started:
            _stop(proc, grace_s)
        raise
    finally:
        for _, pump, log in started:
            pump.join(timeout=5)
            if log is not None:
                log.close()


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)  # the child leads its own session: its helpers go too
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _main(argv: list[str]) -> None:
    """Supervise ``argv``: run it in this process group; kill the group if the pipeline dies."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m r3rag.pipeline.child -- PROGRAM [ARGS...]", file=sys.stderr)
        sys.exit(2)

    def kill_group(signum: int, frame: object) -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)  # the program, its children and this supervisor

    signal.signal(signal.SIGUSR1, kill_group)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop request is the program's to honour
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_parent_death_signal(signal.SIGUSR1)
    parent = os.environ.get("R3RAG_PIPELINE_PARENT")
    if parent and parent.isdigit() and os.getppid() != int(parent):
        sys.exit(137)  # the pipeline died before the request took effect
    proc = subprocess.Popen(argv, preexec_fn=_default_signals)
    while True:
        try:
            rc = proc.wait()
            break
        except InterruptedError:
            continue
    sys.exit(rc if rc >= 0 else 128 - rc)


def _default_signals() -> None:
    """In the program: the signals the supervisor ignores act normally again."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    _main(sys.argv[1:])
