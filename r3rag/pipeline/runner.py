"""Run named stages in order: skip the finished ones, time the rest, always stop the service.

A :class:`Stage` is a name, the stages whose outputs it reads (``needs``), the part of the
config that decides its outputs (``settings``), and a function ``run(ctx) -> summary``. The
runner, for each stage asked for, in pipeline order:

1. computes its fingerprint (its settings plus its upstream stages' fingerprints);
2. if a done marker with that fingerprint exists, prints ``skip`` and moves on; a marker with
   another fingerprint is an error naming the stage and ``--redo``;
3. checks that every stage it needs is done (or is about to run in this invocation);
4. runs it, prints one progress line with the elapsed time, and writes the done marker
   (atomically, after the stage returned, i.e. after its outputs are written). A stage's time
   counts every invocation that worked on it: a killed or failed run leaves its time in
   ``.done/<stage>.clock.json`` (:class:`StageClock`) and the run that finishes adds it.

Resources that live for one invocation only (the retrieval service) are opened lazily through
the :class:`Context` and closed in a ``finally``: on success, on a stage's failure, on Ctrl-C
and on SIGTERM (turned into :class:`Terminated`, an exception, so the ``finally`` runs). The
child processes of the training stages are stopped on the way out by
:func:`r3rag.pipeline.child.run_child`.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from r3rag.errors import ConfigError, R3RagError
from r3rag.pipeline.state import PipelineState, fingerprint


class StageUnusable(R3RagError):
    """A stage finished but produced nothing the next stage can use (the message says what)."""

    stage: str = ""


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C so that every ``finally`` runs."""


@dataclass
class Stage:
    name: str
    title: str
    run: Callable[["Context"], dict[str, Any]]
    needs: tuple[str, ...] = ()
    settings: Callable[["Context"], Any] = lambda ctx: None
    always: bool = False  # cheap and derived (the report): rerun every time it is asked for
    #: delete the outputs made stale by redoing the stages in its second argument (itself included
    #: when redone by name); None: remove ``WORK/<name>`` whole
    reset: Callable[["Context", set[str]], None] | None = None
    #: checked before any stage runs, when this stage is going to run: raise a ConfigError for what
    #: would make it fail late (a missing environment), so nothing before it is spent in vain
    preflight: Callable[["Context"], None] | None = None
    #: run once the stage is marked done (a kill before it only leaves something behind)
    after_done: Callable[["Context"], None] | None = None


@dataclass
class Context:
    """What stages share in one invocation: the config, the work folder, lazily opened services."""

    cfg: Any
    work: Path
    repo_root: Path
    echo: Callable[[str], None] = print
    echo_children: bool = True  # stage programs' output to this process's stdout too (always to their log)
    fingerprints: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)  # what stages hand to the caller (the report)
    _closers: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    _resources: dict[str, Any] = field(default_factory=dict)

    def stage_dir(self, name: str) -> Path:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def resource(self, name: str, opener: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
        """Open ``name`` once per invocation; its closer runs when the pipeline ends, however it ends."""
        if name not in self._resources:
            value, closer = opener()
            self._resources[name] = value
            self._closers.append((name, closer))
        return self._resources[name]

    def close(self) -> list[str]:
        """Close every resource, last opened first; returns the names closed."""
        closed = []
        while self._closers:
            name, closer = self._closers.pop()
            self._resources.pop(name, None)
            try:
                closer()
            except Exception as err:  # one failing closer must not keep the others open
                print(f"warning: closing {name} failed: {err}", file=sys.stderr)
            closed.append(name)
        return closed


@contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (main thread only; else a no-op)."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def plan(stages: Sequence[Stage], wanted: Sequence[str]) -> list[Stage]:
    """The stages named in ``wanted``, in pipeline order (unknown names are a config error)."""
    names = [s.name for s in stages]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ConfigError(f"unknown stage {unknown[0]!r}; stages: {', '.join(names)}")
    return [s for s in stages if s.name in wanted]


def downstream(stages: Sequence[Stage], names: Sequence[str]) -> list[str]:
    """``names`` and every stage that reads their outputs, directly or not, in pipeline order."""
    hit = set(names)
    for s in stages:
        if any(n in hit for n in s.needs):
            hit.add(s.name)
    return [s.name for s in stages if s.name in hit]


class StageClock:
    """Keeps a running stage's time on disk, so that a rerun after a kill adds it to the stage's total.

    Rewritten every ``interval_s`` by a daemon thread (a SIGKILL loses at most that much) and once
    more when the stage stops for any other reason (an error, Ctrl-C). Not written once the stage
    finished: its done marker then holds the total.
    """

    def __init__(self, state: PipelineState, stage: str, fp: str, prior_s: float, attempt: int,
                 enabled: bool = True, interval_s: float = 30.0) -> None:
        self.state, self.stage, self.fp = state, stage, fp
        self.prior_s, self.attempt, self.enabled, self.interval_s = prior_s, attempt, enabled, interval_s
        self.finished = False
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        try:
            self.state.record_spent(self.stage, self.fp, self.prior_s + time.perf_counter() - self._t0, self.attempt)
        except OSError:
            pass  # timing is a report, never a reason to fail a stage

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def __enter__(self) -> "StageClock":
        self._t0 = time.perf_counter()
        if self.enabled:
            self._write()
            self._thread = threading.Thread(target=self._beat, name=f"clock-{self.stage}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.enabled and not self.finished:
            self._write()


def run_pipeline(ctx: Context, stages: Sequence[Stage], wanted: Sequence[str], redo: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``wanted`` stages of ``stages``; return ``{stage: {"status", "elapsed_s", "summary"}}``."""
    todo = plan(stages, wanted)
    by_name = {s.name: s for s in stages}
    bad_redo = [r for r in redo if r not in by_name]
    if bad_redo:
        raise ConfigError(f"--redo {bad_redo[0]!r}: not a stage; stages: {', '.join(by_name)}")
    state = PipelineState(ctx.work)
    redone = set(downstream(stages, redo))
    for name in downstream(stages, redo):  # a redo starts clean: no resume from outputs made from old inputs
        state.clear(name)
        stage = by_name[name]
        if stage.reset is not None:  # told which stages it reads were redone (and itself, when asked by name)
            stage.reset(ctx, redone if name in redo else redone - {name})
        elif (ctx.work / name).is_dir():
            shutil.rmtree(ctx.work / name)
    ctx.work.mkdir(parents=True, exist_ok=True)
    # fingerprints of every stage (those not run here too: a needed stage's marker is checked)
    for s in stages:
        ctx.fingerprints[s.name] = fingerprint(s.settings(ctx), [ctx.fingerprints[n] for n in s.needs])
    for stage in todo:
        if stage.preflight is not None and not state.is_done(stage.name, ctx.fingerprints[stage.name]):
            stage.preflight(ctx)
    outcome: dict[str, Any] = {}
    total = len(todo)
    started = time.perf_counter()
    with sigterm_as_exception():
        try:
            for i, stage in enumerate(todo, 1):
                fp = ctx.fingerprints[stage.name]
                marker = state.get(stage.name)
                head = f"[{i}/{total}] {stage.name:<9}"
                if marker is not None and not stage.always:
                    if marker.get("fingerprint") != fp:
                        raise ConfigError(
                            f"stage {stage.name} in {ctx.work} was finished with other settings; "
                            f"rerun with --redo {stage.name} (it and what follows are redone) or use another --work"
                        )
                    ctx.echo(f"{head} skip: done earlier ({_fmt_s(float(marker.get('elapsed_s', 0.0)))})")
                    outcome[stage.name] = {"status": "skipped", **marker}
                    continue
                for need in stage.needs:
                    if not state.is_done(need, ctx.fingerprints[need]) and need not in {s.name for s in todo[:i - 1]}:
                        raise ConfigError(f"stage {stage.name} needs stage {need}'s outputs in {ctx.work}; "
                                          f"run --stages {need},{stage.name} (or the whole pipeline)")
                prior_s, prior_n = (0.0, 0) if stage.always else state.spent(stage.name, fp)
                resumed = f" (resuming: {_fmt_s(prior_s)} spent in {prior_n} earlier run(s))" if prior_n else ""
                ctx.echo(f"{head} {stage.title} ...{resumed}")
                t0 = time.perf_counter()
                with StageClock(state, stage.name, fp, prior_s, prior_n + 1, enabled=not stage.always) as clock:
                    try:
                        summary = stage.run(ctx) or {}
                    except StageUnusable as err:
                        err.stage = stage.name
                        raise
                    clock.finished = True
                elapsed = prior_s + time.perf_counter() - t0  # this stage's time over every invocation
                if not stage.always:
                    state.mark_done(stage.name, fp, summary, elapsed, attempts=prior_n + 1)
                if stage.after_done is not None:
                    stage.after_done(ctx)
                note = summary.get("line", "")
                this_run = f" ({_fmt_s(elapsed - prior_s)} in this run)" if prior_n else ""
                ctx.echo(f"{head} done in {_fmt_s(elapsed)}{this_run}" + (f": {note}" if note else ""))
                outcome[stage.name] = {"status": "ran", "elapsed_s": round(elapsed, 2), "summary": summary}
        finally:
            closed = ctx.close()
            if closed:
                ctx.echo(f"stopped: {', '.join(closed)}")
    ctx.echo(f"pipeline: {total} stage(s) in {_fmt_s(time.perf_counter() - started)}")
    return outcome
