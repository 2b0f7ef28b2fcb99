"""Every SFT example measured before training: none may be longer than the cutoff.

LLaMA-Factory cuts an example longer than ``cutoff_len`` without a word: it keeps turns until the
budget runs out and shortens the turn it stops in, so a chain can end inside a documents turn and
train the next assistant turn after half a document, in a context the rollout never produces, or
lose its final-answer turn. ``train/sft.py`` therefore measures every example first, in the tokens
LLaMA-Factory will see:

- template ``r3rag``: the rendering of :mod:`r3rag.train.sft.chat_slots` with the model's
  tokenizer, in this process (``tests/test_sft_contract.py`` proves it is LLaMA-Factory's own,
  token for token, at every shipped config's cutoff);
- a stock template: LLaMA-Factory's own preprocessing (:mod:`r3rag.train.sft.lf_preprocess`, no
  cutoff) in its environment.

Then: no example is longer: train on the folder as it is. Some are and ``data.drop_longer`` is
off: :class:`SFTDataError` (one line: how many, the longest, the cutoff). ``data.drop_longer`` on
(template ``r3rag``): the datasets are written without them to ``OUTPUT_DIR/r3rag_data`` (its own
``dataset_info.json``), training reads that folder, and the count is reported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3rag.errors import R3RagError
from r3rag.train.sft.config import SFTConfig

DATA_FOLDER = "r3rag_data"


class SFTDataError(R3RagError):
    """The SFT dataset cannot be trained on as configured (examples longer than the cutoff)."""


@dataclass
class LengthReport:
    examples: int
    longest: int
    cutoff_len: int
    longer: int
    dropped: int = 0
    dataset_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def dataset_names(cfg: SFTConfig) -> list[str]:
    return [n.strip() for n in cfg.data.dataset.split(",") if n.strip()]


def dataset_files(folder: Path, entry: dict[str, Any]) -> list[Path]:
    target = folder / entry["file_name"]
    if target.is_dir():
        return sorted(p for p in target.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
    return [target]


def read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def record_messages(rec: dict[str, Any], entry: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """``(system, messages)`` of one record as LLaMA-Factory's converters read it (sharegpt with
    user / assistant / observation / system tags; alpaca with prompt, query, response, system)."""
    cols = entry.get("columns", {})
    if entry.get("formatting", "alpaca") == "sharegpt":
        tags = entry.get("tags", {})
        role_tag, content_tag = tags.get("role_tag", "from"), tags.get("content_tag", "value")
        roles = {tags.get("user_tag", "human"): "user", tags.get("assistant_tag", "gpt"): "assistant",
                 tags.get("observation_tag", "observation"): "observation"}
        system_tag = tags.get("system_tag", "system")
        system = rec.get(cols.get("system", "system")) or ""
        msgs: list[dict[str, str]] = []
        for i, m in enumerate(rec[cols.get("messages", "conversations")]):
            if i == 0 and m[role_tag] == system_tag:
                system = m[content_tag]
                continue
            if m[role_tag] not in roles:
                raise SFTDataError(f"cannot measure a {m[role_tag]!r} turn (only user, assistant, observation and system)")
            msgs.append({"role": roles[m[role_tag]], "content": m[content_tag]})
        return system, msgs
    if rec.get(cols.get("history", "history")):
        raise SFTDataError("cannot measure alpaca records with a history column")
    query = [rec.get(cols.get("prompt", "instruction")) or "", rec.get(cols.get("query", "input")) or ""]
    user = "\n".join(q for q in query if q)
    return rec.get(cols.get("system", "system")) or "", [
        {"role": "user", "content": user}, {"role": "assistant", "content": rec[cols.get("response", "output")]}]


def r3rag_length(tokenizer: Any, slots: Any, system: str, msgs: list[dict[str, str]]) -> int:
    from r3rag.train.sft.chat_slots import encode_pieces, render_pieces

    return len(encode_pieces(tokenizer, render_pieces(slots, system, msgs))[0])


def _lf_lengths(cfg: SFTConfig, model_path: str, name: str) -> list[int]:
    """Lengths by LLaMA-Factory's own preprocessing, no cutoff (a stock template)."""
    from r3rag.train.sft.launch import ROOT, SFTError, venv_path

    py = venv_path(cfg) / "bin" / "python"
    if not py.is_file():
        raise SFTError(f"LLaMA-Factory environment missing at {venv_path(cfg)}: run bash train/envs/llamafactory.sh")
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "rows.jsonl"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        r = subprocess.run([str(py), "-m", "r3rag.train.sft.lf_preprocess", "--model", str(model_path), "--dataset-dir",
                            str(Path(cfg.data.dataset_dir).resolve()), "--dataset", name, "--template", cfg.template,
                            "--observation-role", cfg.observation_role, "--out", str(dump)],
                           capture_output=True, text=True, cwd=str(ROOT), env=env)
        if r.returncode != 0:
            raise SFTError(f"measuring {name} with LLaMA-Factory failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        return [len(json.loads(line)["input_ids"]) for line in dump.read_text(encoding="utf-8").splitlines()]


def check_lengths(cfg: SFTConfig, model_path: str | Path, out: Path, tokenizer: Any = None) -> LengthReport:
    """Measure every example of ``cfg.data.dataset``; refuse, or drop (see the module docstring).
    Returns the report; ``report.dataset_dir`` is the folder training must read."""
    folder = Path(cfg.data.dataset_dir)
    info = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))
    cutoff = int(cfg.data.cutoff_len or 0)
    r3rag = cfg.template == "r3rag"
    if r3rag:
        from r3rag.train.sft.chat_slots import derive_slots

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        slots = derive_slots(tokenizer, observation_role=cfg.observation_role)
    measured: dict[str, list[tuple[dict[str, Any], int]]] = {}
    for name in dataset_names(cfg):
        entry = info[name]
        if r3rag:
            rows = [rec for p in dataset_files(folder, entry) for rec in read_records(p)]
            measured[name] = [(rec, r3rag_length(tokenizer, slots, *record_messages(rec, entry))) for rec in rows]
        else:
            measured[name] = [({}, n) for n in _lf_lengths(cfg, str(model_path), name)]
    lengths = [n for rows in measured.values() for _, n in rows]
    report = LengthReport(examples=len(lengths), longest=max(lengths, default=0), cutoff_len=cutoff,
                          longer=sum(n > cutoff for n in lengths), dataset_dir=str(folder))
    if not report.longer:
        return report
    where = ", ".join(dataset_names(cfg))
    if not cfg.data.drop_longer:
        raise SFTDataError(
            f"{report.longer} of {report.examples} examples in {where} ({folder}) are longer than data.cutoff_len "
            f"{cutoff} (longest {report.longest} tokens) and LLaMA-Factory would cut them: raise data.cutoff_len "
            "(or set rollout_profile to the profile the data was built with), or --set data.drop_longer=true to leave them out")
    if not r3rag:
        raise SFTDataError(f"data.drop_longer needs template r3rag (this config: {cfg.template}): {report.longer} of "
                           f"{report.examples} examples in {where} are longer than data.cutoff_len {cutoff}")
    report.dropped = report.longer
    report.dataset_dir = str(_write_kept(out / DATA_FOLDER, info, measured, cutoff))
    return report


def _write_kept(dest: Path, info: dict[str, Any], measured: dict[str, list[tuple[dict[str, Any], int]]], cutoff: int) -> Path:
    """The datasets without their too-long records, written whole to a new folder, then swapped in."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    new_info: dict[str, Any] = {}
    for name, rows in measured.items():
        with (tmp / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            for rec, n in rows:
                if n <= cutoff:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        new_info[name] = {**info[name], "file_name": f"{name}.jsonl"}
    (tmp / "dataset_info.json").write_text(json.dumps(new_info, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest
