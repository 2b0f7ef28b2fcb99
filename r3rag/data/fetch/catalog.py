"""What ``python -m r3rag.data.fetch`` can fetch: the public releases the field evaluates and trains on.

Each :class:`Item` is one output file under ``--out`` (default ``data/``), made from files of a
Hugging Face dataset repository (downloaded as they are) or from other items' outputs:

``benchmarks``  FlashRAG's QA sets (``RUC-NLPIR/FlashRAG_datasets``, one folder per set, one
                ``{split}.jsonl`` per split) converted to r3rag's question JSONL:
                ``benchmarks/{set}_{split}.jsonl`` for HotpotQA, 2Wiki, MuSiQue (dev), Bamboogle
                (test) and the single-hop controls NQ, TriviaQA (dev, test) and PopQA (test).
``train``       R3-RAG's training questions: ``{set}_train.jsonl`` for HotpotQA, 2Wiki and MuSiQue;
                ``coldstart_train.jsonl``, the three shuffled together (seeded, ids prefixed with
                the set) for the cold start; ``hotpotqa_train_8192.jsonl``, a seeded sample of
                8,192 HotpotQA training questions for RL (the paper's count; ``--rl-questions``).
                R1-Searcher's stage-1/stage-2 prompts ship in the repository (data/r1searcher/).
``wiki18``      the DPR Wikipedia 2018 passages as Search-R1 publishes them
                (``PeterJinGo/wiki-18-corpus``, ``wiki-18.jsonl.gz``), unpacked to
                ``wiki18/corpus.jsonl`` (``{"id", "contents"}`` a line, row i = index row i).
``e5-index``    Search-R1's e5-base-v2 Flat inner-product index of those passages
                (``PeterJinGo/wiki-18-e5-index``, ``part_aa`` + ``part_ab``), joined as
                ``wiki18/e5_Flat.index`` byte for byte, to be wrapped by
                ``tool/build_index.py --import-faiss``.

The repository ids are defaults (``--benchmarks-repo``, ``--corpus-repo``, ``--index-repo``);
``HF_ENDPOINT`` (or ``--endpoint``) points every download at a mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: repository role -> default Hugging Face dataset repository
DEFAULT_REPOS: dict[str, str] = {
    "benchmarks": "RUC-NLPIR/FlashRAG_datasets",
    "corpus": "PeterJinGo/wiki-18-corpus",
    "index": "PeterJinGo/wiki-18-e5-index",
}

#: r3rag's short name -> FlashRAG's folder
FLASHRAG_NAMES: dict[str, str] = {
    "hotpotqa": "hotpotqa",
    "2wiki": "2wikimultihopqa",
    "musique": "musique",
    "bamboogle": "bamboogle",
    "nq": "nq",
    "triviaqa": "triviaqa",
    "popqa": "popqa",
}

#: evaluation splits fetched per set (FlashRAG has no test answers for the multi-hop sets)
BENCHMARK_SPLITS: dict[str, tuple[str, ...]] = {
    "hotpotqa": ("dev",),
    "2wiki": ("dev",),
    "musique": ("dev",),
    "bamboogle": ("test",),
    "nq": ("dev", "test"),
    "triviaqa": ("dev", "test"),
    "popqa": ("test",),
}
COLDSTART_SETS = ("hotpotqa", "2wiki", "musique")
RL_QUESTIONS = 8192  # R3-RAG's RL: 8,192 HotpotQA training questions
GROUPS = ("benchmarks", "train", "wiki18", "e5-index")


@dataclass(frozen=True)
class Remote:
    role: str  # key of the repository map ("benchmarks", "corpus", "index")
    path: str  # file path inside the repository


@dataclass(frozen=True)
class Item:
    name: str
    group: str
    output: str  # path under --out
    build: str  # questions | gunzip | concat | sample | mix
    remotes: tuple[Remote, ...] = ()
    needs: tuple[str, ...] = ()  # items whose outputs this one is built from
    options: dict = field(default_factory=dict, hash=False, compare=False)
    #: output bytes per downloaded byte, for the disk-space plan (gunzip: an estimate)
    expand: float = 1.0


def catalog(rl_questions: int = RL_QUESTIONS) -> dict[str, Item]:
    """Every fetchable item by name, in the order they are built."""
    items: list[Item] = []
    for short, splits in BENCHMARK_SPLITS.items():
        for split in splits:
            items.append(Item(f"{short}_{split}", "benchmarks", f"benchmarks/{short}_{split}.jsonl", "questions",
                              (Remote("benchmarks", f"{FLASHRAG_NAMES[short]}/{split}.jsonl"),),
                              options={"dataset": short, "split": split}))
    for short in COLDSTART_SETS:
        items.append(Item(f"{short}_train", "train", f"{short}_train.jsonl", "questions",
                          (Remote("benchmarks", f"{FLASHRAG_NAMES[short]}/train.jsonl"),),
                          options={"dataset": short, "split": "train"}))
    items.append(Item("coldstart_train", "train", "coldstart_train.jsonl", "mix",
                      needs=tuple(f"{s}_train" for s in COLDSTART_SETS)))
    items.append(Item(f"hotpotqa_train_{rl_questions}", "train", f"hotpotqa_train_{rl_questions}.jsonl", "sample",
                      needs=("hotpotqa_train",), options={"n": rl_questions}))
    items.append(Item("wiki18", "wiki18", "wiki18/corpus.jsonl", "gunzip", (Remote("corpus", "wiki-18.jsonl.gz"),),
                      expand=3.0))
    items.append(Item("e5-index", "e5-index", "wiki18/e5_Flat.index", "concat",
                      (Remote("index", "part_aa"), Remote("index", "part_ab"))))
    return {it.name: it for it in items}


def select(names: list[str], items: dict[str, Item]) -> list[Item]:
    """The items ``names`` ask for (group or item names) plus what they are built from, in
    catalog order; an unknown name raises ``KeyError`` naming it."""
    wanted: set[str] = set()
    for name in names:
        if name in GROUPS:
            wanted |= {it.name for it in items.values() if it.group == name}
        elif name in items:
            wanted.add(name)
        else:
            raise KeyError(name)
    todo = list(wanted)
    while todo:
        for dep in items[todo.pop()].needs:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [it for it in items.values() if it.name in wanted]
