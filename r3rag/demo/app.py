"""The demo page: ask a question, watch the policy analyse, search, read and answer.

``python -m r3rag.demo.app`` (what ``startup/startup_visualize.sh`` runs) loads
``configs/demo.yaml``-style settings, the ``services.json`` that ``startup/server.sh`` wrote (the
retriever's URL, the dataset, a model server when there is one), builds the policy and the
retrieval client, and serves a Gradio page on 127.0.0.1:7860 by default.

The page's logic lives in :class:`DemoApp`, whose methods are plain (async) functions the tests
call directly: :meth:`DemoApp.answer` yields ``(status, cards, raw view, trajectory file)`` after
every event of :meth:`r3rag.demo.runner.DemoRunner.stream`, so the cards appear one by one as the
rollout engine produces them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator

from r3rag.cli import ArgumentParser, run_main
from r3rag.config import add_config_args, load_config
from r3rag.data.records import Question
from r3rag.demo import cards
from r3rag.demo.config import FORMAT_CHOICES, DemoConfig
from r3rag.demo.runner import DemoRunner, FinalEvent, MessageEvent, RunSettings, StepEvent, save_trajectory
from r3rag.errors import ConfigError

AnswerUpdate = tuple[str, str, str, str | None]


class DemoApp:
    """The page's functions, independent of Gradio: answering, the settings panel, examples."""

    def __init__(self, runner: DemoRunner, trajectory_dir: str | Path, dataset_path: str | None = None) -> None:
        self.runner = runner
        self.cfg = runner.cfg
        self.trajectory_dir = Path(trajectory_dir)
        self.dataset_path = dataset_path

    # ---- answering -----------------------------------------------------------------------------
    async def answer(
        self, question: str | None, format_label: str, max_steps: float, docs_per_step: float, temperature: float
    ) -> AsyncIterator[AnswerUpdate]:
        """Stream ``(status_html, cards_html, raw_html, trajectory_json_path)`` as events arrive."""
        fmt = FORMAT_CHOICES.get(format_label, format_label)
        settings = RunSettings(fmt, max_steps, docs_per_step, temperature)  # type: ignore[arg-type] # checked by the runner
        step_cards: list[str] = []
        messages: list[str] = []
        status = cards.message_html("info", "Thinking ...")
        yield status, cards.cards_html(step_cards), "", None
        async for event in self.runner.stream(question, settings):
            if isinstance(event, StepEvent):
                step_cards.append(cards.step_card_html(event.step))
                yield status, cards.cards_html(step_cards), "", None
            elif isinstance(event, MessageEvent):
                messages.append(cards.message_html(event.level, event.text))
                yield "".join(messages), cards.cards_html(step_cards), "", None
            elif isinstance(event, FinalEvent):
                traj = event.trajectory
                step_cards.append(cards.final_card_html(traj, event.gold, event.scores))
                try:
                    path: str | None = str(save_trajectory(traj, self.trajectory_dir))
                except OSError as err:
                    path = None
                    messages.append(cards.message_html("warning", f"Could not save the trajectory JSON: {err}"))
                done = cards.message_html("info", f"Done: {len(traj.steps)} step(s), stop reason {traj.stop_reason}.")
                yield done + "".join(messages), cards.cards_html(step_cards), cards.raw_view_html(traj), path

    # ---- settings panel --------------------------------------------------------------------------
    async def settings_rows(self) -> list[tuple[str, str, str]]:
        """``(component, what is in use, health)`` for the model, the retriever, the index, the data."""
        r = self.runner
        model_ok, model_msg = await r.policy.health()
        ret_ok, ret_msg = await r.retriever_health()
        index = self.cfg.retrieval.index or "the server's default index"
        stats = await _retriever_stats(r.retriever)
        n_q = len(r.questions)
        c = self.cfg.rollout
        return [
            ("model", r.policy.describe(), _health(model_ok, model_msg)),
            ("retriever", ", ".join(self.cfg.retrieval.urls), _health(ret_ok, ret_msg)),
            ("index", index, stats),
            ("dataset", self.dataset_path or "(none)", f"{n_q} questions loaded" if n_q else "no questions loaded"),
            ("rollout", f"mode {c.mode}, {c.max_turn_tokens} tokens per turn, documents cut to {c.doc_max_chars} chars", "-"),
            ("prompt", r.system_prompt_path(c.format) or "the format's standard instructions", "-"),
        ]

    async def settings_panel(self) -> str:
        return cards.settings_markdown(await self.settings_rows())

    def examples(self) -> list[list[str]]:
        return [[q.question] for q in self.runner.questions[: self.cfg.data.examples]]

    # ---- the Gradio page ------------------------------------------------------------------------
    def build(self) -> Any:
        import gradio as gr

        lim, ro = self.cfg.limits, self.cfg.rollout
        labels = list(FORMAT_CHOICES)
        default_label = next((k for k, v in FORMAT_CHOICES.items() if v == ro.format), labels[0])
        with gr.Blocks(title=self.cfg.page.title, analytics_enabled=False) as page:
            gr.Markdown(f"## {self.cfg.page.title}\nType a question (or pick an example) and watch each step: "
                        "the analysis, the query, the passages the retriever returned, then the final answer.")
            with gr.Tab("Ask"):
                with gr.Row():
                    with gr.Column(scale=3):
                        question = gr.Textbox(label="Question", lines=2, max_lines=6, elem_id="r3-question",
                                              placeholder="e.g. a question from the examples below")
                        ask = gr.Button("Ask", variant="primary", elem_id="r3-ask")
                    with gr.Column(scale=2):
                        fmt = gr.Radio(labels, value=default_label, label="Trajectory format", elem_id="r3-format")
                        steps = gr.Slider(1, lim.max_steps, value=min(ro.max_steps, lim.max_steps), step=1, label="Max steps")
                        docs = gr.Slider(1, lim.max_docs, value=min(max(ro.docs_per_step, 1), lim.max_docs), step=1,
                                         label="Documents per step")
                        temp = gr.Slider(0.0, lim.max_temperature, value=ro.temperature, step=0.05, label="Temperature")
                if self.runner.questions and self.cfg.data.examples:
                    gr.Examples(self.examples(), inputs=[question], label="Examples from the dataset")
                status = gr.HTML(elem_id="r3-status")
                steps_out = gr.HTML(elem_id="r3-cards")
                with gr.Accordion("Raw text the model saw and wrote", open=False):
                    raw = gr.HTML(elem_id="r3-raw")
                download = gr.File(label="Trajectory JSON", elem_id="r3-download", interactive=False)
            with gr.Tab("Settings"):
                panel = gr.Markdown(elem_id="r3-settings")
                refresh = gr.Button("Check health again")
            outputs = [status, steps_out, raw, download]
            ask.click(self.answer, [question, fmt, steps, docs, temp], outputs)
            question.submit(self.answer, [question, fmt, steps, docs, temp], outputs)
            refresh.click(self.settings_panel, None, panel)
            page.load(self.settings_panel, None, panel)
        return page


def _health(ok: bool, msg: str) -> str:
    return ("OK: " if ok else "DOWN: ") + msg


async def _retriever_stats(retriever: Any) -> str:
    probe = getattr(retriever, "astats", None)
    if probe is None:
        return "-"
    try:
        stats = await probe()
    except Exception as err:  # noqa: BLE001 - the panel shows it, nothing more
        return f"stats unavailable ({type(err).__name__})"
    if not isinstance(stats, dict):
        return "-"
    keep = {k: v for k, v in stats.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    return ", ".join(f"{k}={v}" for k, v in list(keep.items())[:6]) or "-"


# ---- assembling the app from a config ------------------------------------------------------------
def services_overrides(path: str | Path) -> list[str]:
    """``--set`` overrides from the ``services.json`` that ``startup/server.sh`` wrote."""
    p = Path(path)
    if not p.is_file():
        return []
    try:
        info = json.loads(p.read_text(encoding="utf-8"))
    except ValueError:
        raise ConfigError(f"{p}: not valid JSON (written by startup/server.sh; delete it and restart)") from None
    out: list[str] = []
    if info.get("retriever_url"):
        out.append(f"retrieval.urls=[{info['retriever_url']}]")
    if info.get("dataset"):
        out.append(f"data.dataset={info['dataset']}")
    if info.get("model_base_url"):
        out += ["policy.backend=openai", f"policy.base_url={info['model_base_url']}"]
        if info.get("model"):
            out.append(f"policy.model={info['model']}")
        if info.get("tokenizer"):
            out.append(f"policy.tokenizer={info['tokenizer']}")
    return out


def load_questions(path: str | None) -> list[Question]:
    if not path:
        return []
    if not Path(path).is_file():
        print(f"warning: {path} not found: no examples or gold answers (run: bash startup/server.sh)", file=sys.stderr)
        return []
    from r3rag.data.readers import read_questions

    if Path(path).stat().st_size == 0:
        print(f"warning: {path} is empty: no examples or gold answers", file=sys.stderr)
        return []
    return read_questions(path)


def build_app(cfg: DemoConfig) -> DemoApp:
    """Load the dataset, the retrieval client and the policy named by ``cfg``."""
    from r3rag.demo.policies import build_policy
    from r3rag.retrieval.client import RetrievalClient

    questions = load_questions(cfg.data.dataset)
    r = cfg.retrieval
    retriever = RetrievalClient(r.urls, timeout=r.timeout_s, retries=r.retries, index=r.index)
    policy = build_policy(cfg.policy, questions)
    runner = DemoRunner(cfg, policy, retriever, questions)
    return DemoApp(runner, Path(cfg.run_dir) / "trajectories", cfg.data.dataset)


FLAG_KEYS = {
    "host": "page.host",
    "port": "page.port",
    "model": "policy.model",
    "backend": "policy.backend",
    "base_url": "policy.base_url",
    "tokenizer": "policy.tokenizer",
    "device": "policy.device",
    "retriever_url": "retrieval.urls",
    "dataset": "data.dataset",
    "run_dir": "run_dir",
    "prompt": "prompt",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="startup/startup_visualize.sh",
        description="Serve the r3rag demo page (Gradio). Start the services first with: bash startup/server.sh",
    )
    add_config_args(p, default=None)
    p.add_argument("--services", default=None, help="services.json written by server.sh (default: RUN_DIR/services.json)")
    p.add_argument("--run-dir", help="server.sh's run directory (default from config: runs/demo)")
    p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="page port (default 7860)")
    p.add_argument("--backend", help="policy: hf (in-process model), openai (model server) or oracle (world gold policy)")
    p.add_argument("--model", help="hf: model folder, hub name, .gguf or 'smollm2'; openai: served model name")
    p.add_argument("--base-url", help="openai: the model server's URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--tokenizer", help="tokenizer for openai/oracle policies (folder, .gguf, smollm2, tiny)")
    p.add_argument("--device", help="hf: cpu, cuda, cuda:1 ...")
    p.add_argument("--prompt", choices=["auto", "fewshot", "standard"],
                   help="policy instructions: standard (trained checkpoints), fewshot (adds a worked example), auto")
    p.add_argument("--retriever-url", help="retrieval service URL (default from services.json)")
    p.add_argument("--dataset", help="questions JSONL for the examples and gold answers")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    flags: list[str] = []
    for attr, key in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if value is not None:
            flags.append(f"{key}=[{value}]" if key == "retrieval.urls" else f"{key}={value}")
    base = load_config(DemoConfig, args.config, flags)
    services = args.services or str(Path(base.run_dir) / "services.json")
    # precedence: config file < services.json < flags < --set
    return load_config(DemoConfig, args.config, services_overrides(services) + flags + list(args.overrides))


def create_server(app: DemoApp) -> Any:
    """The FastAPI app that serves the page at ``/`` and ``GET /health`` (JSON, no model call)."""
    import gradio as gr
    from fastapi import FastAPI

    api = FastAPI(title="r3rag demo", docs_url=None, redoc_url=None)

    @api.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "policy": app.runner.policy.describe(),
            "retriever": app.cfg.retrieval.urls,
            "questions": len(app.runner.questions),
        }

    page = app.build().queue(default_concurrency_limit=1, max_size=32)
    return gr.mount_gradio_app(
        api,
        page,
        path="",
        server_name=app.cfg.page.host,
        server_port=app.cfg.page.port,
        css=cards.CSS,
        allowed_paths=[str(app.trajectory_dir.resolve())],
        show_error=False,
        ssr_mode=False,
        max_file_size="1mb",
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = parse_args(argv)
    cfg = config_from_args(args)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    what = "" if cfg.policy.backend == "oracle" else f" {cfg.policy.model}"
    print(f"loading the {cfg.policy.backend} policy{what} ...", flush=True)
    app = build_app(cfg)
    server = create_server(app)
    url = f"http://{cfg.page.host}:{cfg.page.port}"
    print(f"demo page: {url}  (retriever {', '.join(cfg.retrieval.urls)}; Ctrl-C to stop)", flush=True)
    uvicorn.run(server, host=cfg.page.host, port=cfg.page.port, log_level="warning")
    return 0


if __name__ == "__main__":
    run_main(main)
