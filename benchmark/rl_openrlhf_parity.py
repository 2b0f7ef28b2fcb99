"""The RL parity table: single-machine advantages vs OpenRLHF 0.11.2's own code (with r3rag's hook).

For every shipped recipe (configs/rl/*.yaml: estimator, gamma, lambd, reward clip, KL in the
reward, samples per prompt) and every estimator OpenRLHF's parser offers (at the R3-RAG recipe's
gamma/lambd), on seeded batches with per-step rewards, documents of 5/50/300 tokens between the
model turns, dropped samples, groups of equal totals and a reward above 10, it reports the largest
difference of advantages and returns over the kept samples' action tokens between the single
machine (r3rag.train.rl.estimators) and OpenRLHF's ``compute_advantages_and_returns`` with the
per-step hook (r3rag.train.openrlhf.per_step). ``--before REV`` measures another revision's r3rag
with the same harness (tests/openrlhf_checks.py parity) for the before/after columns.

Needs OpenRLHF's environment (bash train/envs/openrlhf.sh --cpu). About a minute per revision on
2 CPU cores.

Example::

    python benchmark/rl_openrlhf_parity.py --before 1a7c538 --out docs/results/rl_openrlhf_parity.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's r3rag

from r3rag.machine import cpu_name  # noqa: E402

TOL = 1e-5


DIFFERENCES = [
    "## Deliberate differences from stock OpenRLHF",
    "",
    "Both r3rag paths (one machine, and OpenRLHF with `python -m r3rag.train.openrlhf.launch`) follow these; stock "
    "OpenRLHF (`R3RAG_PER_STEP=0`) does not. Where none applies (an outcome reward, no document between model turns, "
    "nothing dropped, a real spread) all three give the same numbers (`tests/test_rl_openrlhf_parity.py`).",
    "",
    "- **Per-step rewards.** Each step's reward sits on that step's last generated token; the group shaping "
    "`r -> a r - b` multiplies every step reward by `a` and puts `-b` on the last token, so the return at the first "
    "token is the shaped total. Stock OpenRLHF has one reward per sample, on its last token.",
    "- **Documents are not time steps.** Returns and GAE run over generated tokens only. Stock OpenRLHF runs them over "
    "every response position, so at R3-RAG's lambd 0.95 a 50-token document multiplies the credit of the step after "
    "it by 0.95^50 = 0.08: the recipe would train a different objective on the cluster.",
    "- **Baselines from kept samples.** A sample dropped for an outage (judge, retrieval, engine) or with no generated "
    "token takes no part in a group's mean, std or leave-one-out sum; a group left with one kept sample gets no "
    "advantage from its reward. Stock OpenRLHF averages the dropped sample's reward of 0 in.",
    "- **No division by a vanishing spread.** `group_norm` (and `group_norm_split`) give 0 to a group whose reward std "
    "is at most `algo.min_group_std` (1e-3; `R3RAG_MIN_GROUP_STD` on the cluster): equal or nearly equal totals carry "
    "no signal. Stock OpenRLHF divides by `std + 1e-9`: its outcome z-scores stay bounded (a group of std 1e-7 still "
    "gets +-0.87, noise amplified), but per-step rewards scaled by `1 / (std + 1e-9)` reached 1.4e9 before the guard.",
    "- **Ours only.** `rft` (rejection sampling) and `group_norm_split` run on one machine; they have no OpenRLHF "
    "counterpart.",
    "",
    "Shared with OpenRLHF on purpose: its estimator names and formulas (including `flash_reinforce`), the reward clip "
    "`(-10, 10)` by default (`algo.reward_clip`, `--reward.clip_range`), k3's clamp of the log-ratio at -10 before "
    "`exp`, `gamma = 1` forced for the group estimators and `flash_reinforce`, batch whitening for `gae`, `reinforce` "
    "and `reinforce_baseline`.",
    "",
]


def measure(r3rag_root: Path, python: Path) -> dict:
    """tests/openrlhf_checks.py parity, with ``r3rag_root``'s r3rag (and configs) on PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(r3rag_root), str(ROOT / "tests")]))
    proc = subprocess.run([str(python), str(ROOT / "tests" / "openrlhf_checks.py"), "parity"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("R3RAG-RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"rl_openrlhf_parity: the parity harness failed on {r3rag_root}: {tail}")
    return json.loads(lines[-1][len("R3RAG-RESULT "):])


def checkout(rev: str, dest: Path) -> Path:
    """``rev``'s tree (r3rag/ and configs/) unpacked into ``dest`` (no worktree, nothing left behind)."""
    archive = dest / "tree.tar"
    with archive.open("wb") as fh:
        proc = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "r3rag", "configs"], stdout=fh, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"rl_openrlhf_parity: git archive {rev}: {proc.stderr.decode().strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "tree", filter="data")
    return dest / "tree"


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x <= TOL:
        return f"{x:.0e} ok" if x > 0 else "0 ok"
    return f"**{x:.3g}**" if x < 1e3 else f"**{x:.1e}**"


def table(after: dict, before: dict | None) -> list[str]:
    settings = after["settings"]
    idx = lambda res: {(r["case"], r["setting"]): r for r in res["results"]}  # noqa: E731
    a, b = idx(after), idx(before) if before else {}
    cases = [c["name"] for c in after["cases"] if c["estimator"] in after["openrlhf_estimators"]]
    head = "| recipe / estimator | " + " | ".join(settings) + " |"
    out = [head, "|" + "---|" * (len(settings) + 1)]
    for name in cases:
        cells = []
        for s in settings:
            now = _fmt(a[(name, s)]["single_vs_hook"])
            cells.append(f"{_fmt(b[(name, s)]['single_vs_hook'])} → {now}" if (name, s) in b else now)
        case = next(c for c in after["cases"] if c["name"] == name)
        label = f"{name} ({case['estimator']}, γ {case['gamma']}, λ {case['lambd']})"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def largest(res: dict, setting: str, key: str, estimator: str | None = None) -> float:
    est = {c["name"]: c["estimator"] for c in res["cases"]}
    vals = [r[key] for r in res["results"] if r["setting"] == setting and r[key] is not None
            and (estimator is None or est[r["case"]] == estimator)]
    return max(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="example: python benchmark/rl_openrlhf_parity.py "
                                 "--before 1a7c538 --out docs/results/rl_openrlhf_parity.md",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a git revision to measure too (the 'before' of each cell)")
    ap.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    ap.add_argument("--python", type=Path, default=Path(os.environ.get("R3RAG_OPENRLHF_VENV", ROOT / ".venvs" / "openrlhf")) / "bin" / "python",
                    help="OpenRLHF's environment's python (default: .venvs/openrlhf/bin/python)")
    args = ap.parse_args(argv)
    if not args.python.is_file():
        print(f"rl_openrlhf_parity: {args.python} not found (bash train/envs/openrlhf.sh --cpu)", file=sys.stderr)
        return 2
    print("[1/2] measuring this checkout", file=sys.stderr)
    after = measure(ROOT, args.python)
    before = None
    if args.before:
        print(f"[2/2] measuring {args.before}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            before = measure(checkout(args.before, Path(tmp)), args.python)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    ref_a, ref_b = after["reference_gae"], (before or {}).get("reference_gae")
    lines = [
        "# RL objective: one machine vs OpenRLHF",
        "",
        f"Measured {datetime.date.today().isoformat()} on {cpu_name()} ({os.cpu_count()} cores), OpenRLHF 0.11.2 (CPU "
        f"environment), r3rag {rev}" + (f" against {args.before}" if args.before else "") + ". Regenerate:",
        "",
        "    python benchmark/rl_openrlhf_parity.py" + (f" --before {args.before}" if args.before else "") + " --out docs/results/rl_openrlhf_parity.md",
        "",
        "Each cell: the largest difference, over the kept samples' action tokens, between the advantages (and "
        "returns) of the single-machine trainer (`r3rag.train.rl.estimators`) and of OpenRLHF's own "
        "`compute_advantages_and_returns` with r3rag's hook installed (the cluster path), on the same seeded batch "
        f"({'before → after; ' if before else ''}ok: at most {TOL:g}, float32 rounding). Rows: every shipped recipe of "
        "configs/rl/ with an OpenRLHF counterpart, and every estimator OpenRLHF's own parser offers at the R3-RAG recipe's "
        "gamma 1.0, lambd 0.95 and KL 0.01 in the reward. Columns: an outcome reward on contiguous tokens; per-step "
        "rewards with documents of 5/50/300 tokens between model turns; the same with one dropped sample in two groups "
        "(judge or retrieval outage); groups whose totals are equal or equal within 1e-6 while their step rewards differ "
        "(dynamic filtering off); an outcome reward of 12 (above the clip). world_sft_rft (rejection sampling) has no "
        "OpenRLHF counterpart.",
        "",
        *table(after, before),
        "",
        "GAE reference (R3-RAG recipe: gamma 1.0, lambd 0.95; step rewards 0.6 then 2.0, steps of 1 and 4 tokens, zero "
        "values): the return at the first step's token, with a document of D tokens between the steps.",
        "",
        "| D | single machine | OpenRLHF + hook" + (" (before → after)" if ref_b else "") + " | stock OpenRLHF (sum on the last token) |",
        "|---|---|---|---|",
    ]
    for doc, v in ref_a.items():
        hook = f"{ref_b[doc]['openrlhf']:.3f} → {v['openrlhf']:.3f}" if ref_b else f"{v['openrlhf']:.3f}"
        lines.append(f"| {doc} | {v['single']:.3f} | {hook} | {v['stock']:.3f} |")
    lines += [
        "",
        "Largest |advantage| of a `group_norm` row in the equal-totals column, single machine: "
        f"{largest(after, 'steps, equal totals', 'max_abs_single', 'group_norm'):.3g}"
        + (f" (before: {largest(before, 'steps, equal totals', 'max_abs_single', 'group_norm'):.3g})" if before else "")
        + "; stock OpenRLHF, which has no step rewards: "
        f"{largest(after, 'steps, equal totals', 'max_abs_stock', 'group_norm'):.3g}.",
        f"Every estimator OpenRLHF offers ({', '.join(after['openrlhf_estimators'])}) runs on one machine too; OpenRLHF's "
        f"default reward clip {tuple(after['openrlhf_clip_range'])} is the single machine's.",
        "",
        *DIFFERENCES,
    ]
    text = "\n".join(lines)
    if args.json:
        args.json.write_text(json.dumps({"after": after, "before": before}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
