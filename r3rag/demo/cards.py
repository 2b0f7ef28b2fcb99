"""HTML for the demo page: one card per step, the final-answer card, the raw view, messages.

Every string that came from a model, a question or a passage is HTML-escaped before it is placed
in markup (a model can write ``<script>``). The class names (``r3-step``, ``r3-final``,
``r3-passage``, ``r3-env`` ...) are what the stylesheet in :data:`CSS` and the browser test use.
"""

from __future__ import annotations

from html import escape
from typing import Iterable

from r3rag.data.records import Passage, Question
from r3rag.rollout.trajectory import Step, Trajectory

STOP_REASON_TEXT: dict[str, str] = {
    "answered": "the model gave a final answer",
    "max_steps": "the step limit was reached before an answer",
    "max_tokens": "the token budget ran out before an answer",
    "format_error": "the model's turn did not follow the format",
    "retrieval_failed": "the retrieval service failed",
    "backend_error": "the model backend failed (not the model's fault)",
}

MESSAGE_ICONS: dict[str, str] = {"error": "&#9888;", "warning": "&#9888;", "info": "&#8505;"}

CSS = """
.r3-card{border:1px solid #d0d7de;border-radius:10px;padding:12px 14px;margin:10px 0;background:#fff;color:#1f2328}
.r3-card h3{margin:0 0 8px 0;font-size:1.05em}
.r3-label{font-weight:600;color:#57606a;margin-right:6px}
.r3-query{background:#ddf4ff;border-radius:6px;padding:2px 6px;font-family:monospace}
.r3-passage{border-left:3px solid #54aeff;margin:6px 0;padding:2px 8px;background:#f6f8fa}
.r3-passage summary{cursor:pointer}
.r3-score{color:#57606a;font-size:.9em;margin-left:6px}
.r3-pid{color:#8c959f;font-size:.8em;margin-left:6px}
.r3-ferr{color:#9a6700;background:#fff8c5;border-radius:6px;padding:4px 8px;margin-top:6px}
.r3-final{border:2px solid #1a7f37;background:#f0fff4}
.r3-final .r3-answer{font-size:1.25em;font-weight:700}
.r3-final.r3-noanswer,.r3-final.r3-wrong{border-color:#9a6700;background:#fffbea}
.r3-metrics td,.r3-metrics th{padding:2px 10px;border-bottom:1px solid #d0d7de;text-align:left}
.r3-msg{border-radius:8px;padding:8px 12px;margin:8px 0}
.r3-msg-error{background:#ffebe9;border:1px solid #ff8182;color:#82071e}
.r3-msg-warning{background:#fff8c5;border:1px solid #d4a72c;color:#4d2d00}
.r3-msg-info{background:#ddf4ff;border:1px solid #54aeff;color:#0a3069}
.r3-raw{white-space:pre-wrap;font-family:monospace;font-size:.85em;line-height:1.4;background:#f6f8fa;color:#1f2328;
  padding:10px;border-radius:8px;max-height:520px;overflow:auto}
.r3-raw .r3-prompt{color:#57606a}
.r3-raw .r3-model{color:#0550ae}
.r3-raw mark.r3-env{background:#fff1a8;color:#3b2300}
.r3-legend span{margin-right:14px}
"""


def passage_html(i: int, p: Passage) -> str:
    """One retrieved passage: title and score; the text folds out."""
    score = f'<span class="r3-score">score {p.score:.3f}</span>' if p.score is not None else ""
    body = escape(p.text) if p.text else "<em>(no text)</em>"
    return (
        f'<details class="r3-passage" data-pid="{escape(p.id)}"><summary>({i}) <b>{escape(p.title)}</b>{score}'
        f'<span class="r3-pid">{escape(p.id)}</span></summary><div>{body}</div></details>'
    )


def step_card_html(step: Step) -> str:
    """A step: its analysis, then its query and retrieved passages, or its answer, or its error."""
    parts = [f'<div class="r3-card r3-step" data-step="{step.index + 1}"><h3>Step {step.index + 1}</h3>']
    if step.analysis:
        parts.append(f'<div><span class="r3-label">Analysis</span>{escape(step.analysis)}</div>')
    if step.query is not None:
        parts.append(f'<div><span class="r3-label">Query</span><span class="r3-query">{escape(step.query)}</span></div>')
        if step.documents:
            parts.append(f'<div class="r3-label">Retrieved passages ({len(step.documents)})</div>')
            parts.extend(passage_html(i + 1, p) for i, p in enumerate(step.documents))
        else:
            parts.append('<div class="r3-label">No passages were inserted for this query.</div>')
    if step.answer is not None:
        parts.append(f'<div><span class="r3-label">Answer</span>{escape(step.answer)}</div>')
    if step.format_error:
        raw = f"<pre>{escape(step.raw)}</pre>" if step.raw and not step.analysis else ""
        parts.append(f'<div class="r3-ferr">Format problem: {escape(step.format_error)}{raw}</div>')
    parts.append("</div>")
    return "".join(parts)


def metrics_table_html(scores: dict[str, float]) -> str:
    head = "".join(f"<th>{escape(k)}</th>" for k in scores)
    row = "".join(f"<td>{v:.2f}</td>" for v in scores.values())
    return f'<table class="r3-metrics"><tr>{head}</tr><tr>{row}</tr></table>'


def final_card_html(traj: Trajectory, gold: Question | None = None, scores: dict[str, float] | None = None) -> str:
    """The outcome: the answer (or why there is none), the stop reason, gold answers and metrics."""
    reason = traj.stop_reason or "unknown"
    why = STOP_REASON_TEXT.get(reason, reason)
    answered = traj.answer is not None
    wrong = bool(scores) and max(scores.values()) == 0.0
    cls = "r3-card r3-final" + ("" if answered else " r3-noanswer") + (" r3-wrong" if answered and wrong else "")
    answer = escape(traj.answer) if answered else "<em>no final answer</em>"
    parts = [
        f'<div class="{cls}" data-stop="{escape(reason)}"><h3>Final answer</h3>',
        f'<div class="r3-answer">{answer}</div>',
        f'<div><span class="r3-label">Stopped</span>{escape(why)} ({escape(reason)}); '
        f"{len(traj.steps)} step(s), {traj.num_retrievals} retrieval(s), {traj.num_generated_tokens} generated tokens</div>",
    ]
    if gold is not None and gold.golden_answers:
        golds = " | ".join(escape(a) for a in gold.golden_answers)
        parts.append(f'<div class="r3-gold"><span class="r3-label">Gold answer</span>{golds}</div>')
        hops = gold.metadata.get("hops")
        kind = gold.metadata.get("type")
        if hops or kind:
            what = f'{escape(str(kind or ""))} {escape(str(hops or ""))}-hop ({escape(gold.id)})'
            parts.append(f'<div><span class="r3-label">Question</span>{what}</div>')
    if scores:
        parts.append(metrics_table_html(scores))
    parts.append("</div>")
    return "".join(parts)


def raw_view_html(traj: Trajectory) -> str:
    """The exact text the model saw and wrote; environment spans (masked from training) highlighted."""
    legend = (
        '<div class="r3-legend"><span class="r3-prompt">prompt (grey)</span><span class="r3-model">model tokens (blue)</span>'
        '<mark class="r3-env">environment: documents, masked from the loss</mark></div>'
    )
    spans = []
    for seg in traj.segments:
        text = escape(seg.text)
        if seg.role == "env":
            spans.append(f'<mark class="r3-env" title="environment ({len(seg.token_ids)} tokens, loss mask 0)">{text}</mark>')
        else:
            spans.append(f'<span class="r3-{seg.role}" title="{seg.role} ({len(seg.token_ids)} tokens)">{text}</span>')
    return legend + '<div class="r3-raw">' + "".join(spans) + "</div>"


def message_html(level: str, text: str) -> str:
    icon = MESSAGE_ICONS.get(level, "")
    return f'<div class="r3-msg r3-msg-{escape(level)}" role="alert">{icon} {escape(text)}</div>'


def cards_html(cards: Iterable[str]) -> str:
    return '<div class="r3-cards">' + "".join(cards) + "</div>"


def settings_markdown(rows: list[tuple[str, str, str]]) -> str:
    """The settings panel: ``(component, what, health)`` rows as a Markdown table."""
    lines = ["| component | in use | health |", "|---|---|---|"]
    for name, what, health in rows:
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731 - table-cell escaping
        lines.append(f"| {cell(name)} | {cell(what)} | {cell(health)} |")
    return "\n".join(lines)
