"""Trajectories -> SFT data: LLaMA-Factory sharegpt, R3-RAG's alpaca-per-step, dataset_info.json.

- **sharegpt** (the default for SFT): one record per trajectory,
  ``{"id", "system", "conversations": [{"from": "human"|"gpt"|"observation", "value"}]}``. The human
  turn is the question as the rollout's user message, each ``gpt`` turn is one model turn (without
  its end-of-turn token, which the template adds), each ``observation`` turn the documents that
  turn's query brought back, rendered by the format. Documents appear only in observation turns,
  which LLaMA-Factory never trains on.
- **alpaca-per-step** (R3-RAG's own layout): one record per model turn,
  ``{"instruction": question + previous turns with their documents, "input": "", "output": the
  turn, "system"}``. It keeps documents out of the loss too, but the student then sees earlier
  turns as user text, not as its own: the sharegpt layout is the one that matches the RL rollout.

:func:`rendering_matches` proves, per trajectory, that LLaMA-Factory's rendering of the sharegpt
record with the slots of :mod:`r3rag.train.sft.chat_slots` gives the rollout's ids and mask
(:func:`~r3rag.train.sft.chat_slots.sft_view`); the exporter drops (and counts) any that do not,
e.g. a teacher whose sampled ids are not the tokenizer's canonical encoding of its text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from r3rag.train.sft.chat_slots import ChatSlots, encode_pieces, render_pieces, sft_view

ROLE_TAGS = {"user": "human", "assistant": "gpt"}
SHAREGPT_FILE = "sharegpt"  # a folder of part files (LLaMA-Factory reads every file in it)
ALPACA_FILE = "alpaca_steps"


def trajectory_messages(traj: Any, fmt: Any) -> tuple[str, list[dict[str, str]]]:
    """``(system, messages)`` of a trajectory, messages with roles user/assistant/observation."""
    msgs = fmt.trajectory_messages(traj)
    system = ""
    out: list[dict[str, str]] = []
    for m in msgs:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] in ("user", "assistant"):
            out.append({"role": m["role"], "content": m["content"]})
        else:
            out.append({"role": "observation", "content": m["content"]})
    return system, out


def to_sharegpt(traj: Any, fmt: Any) -> dict[str, Any]:
    system, msgs = trajectory_messages(traj, fmt)
    conv = [{"from": ROLE_TAGS.get(m["role"], "observation"), "value": m["content"]} for m in msgs]
    return {"id": f"{traj.question_id}#{traj.sample_index}", "format": traj.format_name, "system": system, "conversations": conv}


def to_alpaca_steps(traj: Any, fmt: Any) -> list[dict[str, Any]]:
    system, msgs = trajectory_messages(traj, fmt)
    rows: list[dict[str, Any]] = []
    context = msgs[0]["content"]
    for m in msgs[1:]:
        if m["role"] == "assistant":
            rows.append({"instruction": context, "input": "", "output": m["content"], "system": system,
                         "id": f"{traj.question_id}#{traj.sample_index}/{len(rows)}"})
        context += "\n\n" + m["content"]
    return rows


def rendering_matches(traj: Any, fmt: Any, slots: ChatSlots, tokenizer: Any) -> bool:
    """True when the sharegpt rendering tokenises, piece by piece, to the rollout's ids and mask
    (end-of-turn convention applied)."""
    system, msgs = trajectory_messages(traj, fmt)
    ids, mask = encode_pieces(tokenizer, render_pieces(slots, system, msgs))
    eot_ids = list(tokenizer(slots.eot, add_special_tokens=False).input_ids)
    return (ids, mask) == sft_view(traj, eot_ids)


def dataset_info(prefix: str = "r3rag", sharegpt_file: str = SHAREGPT_FILE, alpaca_file: str = ALPACA_FILE) -> dict[str, Any]:
    """LLaMA-Factory's ``dataset_info.json`` registering ``PREFIX_sharegpt`` and
    ``PREFIX_alpaca_steps`` (file or folder names relative to the dataset folder)."""
    return {
        f"{prefix}_sharegpt": {
            "file_name": sharegpt_file,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system"},
            "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                     "observation_tag": "observation"},
        },
        f"{prefix}_alpaca_steps": {
            "file_name": alpaca_file,
            "formatting": "alpaca",
            "columns": {"prompt": "instruction", "query": "input", "response": "output", "system": "system"},
        },
    }


def write_dataset_info(folder: str | Path, prefix: str = "r3rag", path: str | Path | None = None, **files: str) -> Path:
    path = Path(path) if path is not None else Path(folder) / "dataset_info.json"
    path.write_text(json.dumps(dataset_info(prefix, **files), indent=2) + "\n", encoding="utf-8")
    return path
