"""HotpotQA, 2WikiMultiHopQA and MuSiQue from Hugging Face ``datasets``, as :class:`Question` records.

Each dataset is a registered converter from its published row layout to our record, plus the hub
id and split a user with internet gets by default. The same converters read a local copy
(``source`` = a ``.json``/``.jsonl``/``.parquet`` file or a folder saved with ``save_to_disk``),
which is how the tests exercise them on machines with no hub access.

>>> row = {"id": "5a8b", "question": "Who?", "answer": "Ann", "type": "bridge", "level": "hard"}
>>> HF_DATASETS["hotpotqa"].convert(row, 0).golden_answers
['Ann']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from r3rag.data.records import Question
from r3rag.errors import DataError


@dataclass(frozen=True)
class HFDataset:
    hub_id: str
    config: str | None
    split: str
    convert: Callable[[dict[str, Any], int], Question]


def _hotpotqa(row: dict[str, Any], i: int) -> Question:
    sf = row.get("supporting_facts") or {}
    titles = sf.get("title", []) if isinstance(sf, dict) else [t for t, _ in sf]
    return Question(
        id=str(row.get("id", row.get("_id", i))),
        question=row["question"],
        golden_answers=[row["answer"]],
        metadata={"type": row.get("type"), "level": row.get("level"), "supporting_titles": list(dict.fromkeys(titles))},
    )


def _twowiki(row: dict[str, Any], i: int) -> Question:
    sf = row.get("supporting_facts") or []
    titles = sf.get("title", []) if isinstance(sf, dict) else [t for t, _ in sf]
    return Question(
        id=str(row.get("_id", row.get("id", i))),
        question=row["question"],
        golden_answers=[row["answer"]],
        metadata={"type": row.get("type"), "supporting_titles": list(dict.fromkeys(titles)), "evidences": row.get("evidences")},
    )


def _musique(row: dict[str, Any], i: int) -> Question:
    decomposition = [
        {"question": d.get("question"), "answer": d.get("answer")} for d in row.get("question_decomposition") or []
    ]
    qid = str(row.get("id", i))
    hops = len(decomposition) or (int(qid[0]) if qid[:1].isdigit() else None)
    return Question(
        id=qid,
        question=row["question"],
        golden_answers=[row["answer"], *(row.get("answer_aliases") or [])],
        metadata={"hops": hops, "answerable": row.get("answerable", True), "decomposition": decomposition},
    )


HF_DATASETS: dict[str, HFDataset] = {
    "hotpotqa": HFDataset("hotpotqa/hotpot_qa", "distractor", "validation", _hotpotqa),
    "2wiki": HFDataset("framolfese/2WikiMultihopQA", None, "validation", _twowiki),
    "musique": HFDataset("bdsaglam/musique", "answerable", "validation", _musique),
}


def load_hf_questions(
    name: str,
    source: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Question]:
    """Questions of a registered dataset, from the hub (``source=None``) or a local copy.

    ``source`` may be a hub id, a local JSON/JSONL/Parquet file, or a ``save_to_disk`` folder.
    """
    if name not in HF_DATASETS:
        raise DataError(f"unknown Hugging Face dataset {name!r}; known: {sorted(HF_DATASETS)}")
    spec = HF_DATASETS[name]
    import datasets  # deferred: importing datasets costs about a second

    split = split or spec.split
    path = Path(source) if source else None
    try:
        if path is not None and path.is_dir():
            ds = datasets.load_from_disk(str(path))
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        elif path is not None and path.is_file():
            builder = "parquet" if path.suffix == ".parquet" else "json"
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            ds = datasets.load_dataset(source or spec.hub_id, spec.config, split=split)
    except Exception as err:  # the hub being unreachable is the common case here
        where = source or spec.hub_id
        raise DataError(f"{where}: could not load dataset {name!r} ({type(err).__name__}: {err})") from None
    out = []
    for i, row in enumerate(ds):
        try:
            out.append(spec.convert(row, i))
        except (KeyError, TypeError) as err:
            raise DataError(f"{source or spec.hub_id}: row {i}: not a {name} row (missing or bad field {err})") from None
        if limit is not None and len(out) >= limit:
            break
    return out
