"""Fetch the public benchmarks, training questions, wiki18 passages and Search-R1's e5 index.

Names are groups (benchmarks, train, wiki18, e5-index) or single items (--list shows them all,
with sizes). Files go under --out (default data/): benchmarks/{set}_{split}.jsonl, the training
questions ({set}_train.jsonl, coldstart_train.jsonl, hotpotqa_train_8192.jsonl),
wiki18/corpus.jsonl, wiki18/e5_Flat.index, and fetch_manifest.json (sha256 and size of each).

Downloads go through huggingface_hub, so HF_ENDPOINT (or --endpoint) selects a mirror and
HF_TOKEN is sent. A rerun verifies what is there, continues a killed download where it stopped,
and rebuilds a file that no longer matches its checksum (naming it).

Examples:
  python -m r3rag.data.fetch --list
  python -m r3rag.data.fetch benchmarks train --dry-run
  python -m r3rag.data.fetch benchmarks train wiki18 e5-index
  HF_ENDPOINT=https://hf-mirror.com python -m r3rag.data.fetch hotpotqa_dev
  python -m r3rag.data.fetch --verify
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from r3rag.cli import ArgumentParser
from r3rag.data.fetch.catalog import DEFAULT_REPOS, GROUPS, RL_QUESTIONS, catalog, select
from r3rag.data.fetch.fetcher import LOCK, Fetcher, Settings, eprint, gb
from r3rag.data.fetch.hub import FetchError


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m r3rag.data.fetch", description=__doc__)
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"groups ({', '.join(GROUPS)}) or items (see --list)")
    ap.add_argument("--out", default="data", help="where the files go (default: %(default)s)")
    ap.add_argument("--list", action="store_true", help="print every item, its source and size, and exit")
    ap.add_argument("--dry-run", action="store_true", help="print what would be downloaded and built, the disk "
                    "space it needs and what is free; change nothing")
    ap.add_argument("--verify", action="store_true", help="re-hash every file in the manifest; name the bad ones, exit 1 if any")
    ap.add_argument("--keep-raw", action="store_true", help="keep the downloaded files under OUT/.hub after conversion")
    ap.add_argument("--endpoint", help="Hugging Face Hub URL or mirror (default: $HF_ENDPOINT or https://huggingface.co)")
    ap.add_argument("--revision", default="main", help="branch, tag or commit of every repository (default: %(default)s)")
    for role, repo in DEFAULT_REPOS.items():
        ap.add_argument(f"--{role}-repo", default=repo, help=f"dataset repository of the {role} (default: %(default)s)")
    ap.add_argument("--rl-questions", type=int, default=RL_QUESTIONS,
                    help="HotpotQA training questions sampled for RL (default: %(default)s, R3-RAG's count)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the RL sample and the cold-start shuffle")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(out=Path(args.out), repos={role: getattr(args, f"{role}_repo") for role in DEFAULT_REPOS},
                    revision=args.revision, endpoint=args.endpoint, keep_raw=args.keep_raw, seed=args.seed,
                    progress=not args.quiet)


def _print_list(fetcher: Fetcher) -> None:
    print(f"{'item':24} {'group':11} {'size':>10}  source -> {fetcher.s.out}/...")
    reachable = True
    for item in fetcher.items:
        if item.remotes:
            size = "?"
            if reachable:
                try:
                    size = gb(sum(fetcher.remote(r).size or 0 for r in item.remotes))
                except FetchError as err:
                    reachable = False  # one line, then the rest of the list without sizes
                    eprint(f"note: sizes unknown: {err}")
            src = " + ".join(f"{fetcher.s.repos[r.role]}:{r.path}" for r in item.remotes)
        else:
            size, src = "", "from " + ", ".join(item.needs)
        print(f"{item.name:24} {item.group:11} {size:>10}  {src} -> {item.output}")


def _print_plan(fetcher: Fetcher, steps: list) -> None:
    for st in steps:
        out = fetcher.output(st.item)
        if st.status == "ok":
            print(f"ok      {out}")
            continue
        what = ", ".join(f"{r.source} ({gb(r.size or 0)})" for r in st.remotes) or "built from " + ", ".join(st.item.needs)
        resume = f", {gb(st.have)} already here" if st.have else ""
        print(f"fetch   {out} <- {what}{resume}")
    need, down, outs = fetcher.disk_need(steps)
    from r3rag.data.fetch.fetcher import free_bytes

    print(f"to download {gb(down)}; disk needed {gb(need)} (outputs ~{gb(outs)}); free under {fetcher.s.out}: "
          f"{gb(free_bytes(fetcher.s.out))}")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rl_questions < 1:
        ap.error("--rl-questions must be at least 1")
    if args.endpoint:
        os.environ["HF_ENDPOINT"] = args.endpoint.rstrip("/")
    items = catalog(args.rl_questions)
    try:
        chosen = select(args.names, items) if args.names else list(items.values())
    except KeyError as err:
        ap.error(f"unknown item {err.args[0]!r}; groups: {', '.join(GROUPS)}; items: see --list")
    if not (args.names or args.list or args.verify):
        ap.error("name what to fetch (e.g. benchmarks train wiki18), or --list")
    fetcher = Fetcher(_settings(args), chosen)
    if args.list:
        _print_list(fetcher)
        return 0
    if args.verify:
        bad = fetcher.verify()
        for line in bad:
            eprint(line)
        n = len(fetcher.manifest.files)
        print(f"{n - len(bad)} of {n} files match {fetcher.manifest.path}")
        return 1 if bad else 0
    if args.dry_run:
        _print_plan(fetcher, fetcher.plan(deep=False))
        return 0
    from filelock import FileLock, Timeout

    fetcher.s.out.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(fetcher.s.out / LOCK), timeout=0):
            built = fetcher.run(fetcher.plan())
    except Timeout:
        raise FetchError(f"another fetch is writing to {fetcher.s.out} ({fetcher.s.out / LOCK}); wait for it") from None
    print(f"{built} file(s) fetched, {len(chosen) - built} already there; manifest: {fetcher.manifest.path}")
    return 0
