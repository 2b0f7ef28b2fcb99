"""One home for each rule, so that a rule changed in one place holds everywhere.

- one tokenizer loader (``r3rag.rollout.backends.hf_loading.load_tokenizer``), which sets the pad token;
- one end-of-turn rule (``strip_end``) for the rollout parsers and the reward checkers;
- a format's rules come from its own registered class, so a new format is one class for rewards too;
- one name per format (its registered name) in trajectories, rewards, rollout config and evaluation;
- no command-line program inside the library, and no production import of ``r3rag.testing``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.errors import ConfigError
from r3rag.rewards.format import FormatConfig, Violation, format_violations
from r3rag.rollout.formats import FORMATS, get_format
from r3rag.rollout.formats.base import ParsedTurn, TrajectoryFormat
from r3rag.rollout.formats.registry import register_format
from r3rag.rollout.trajectory import Segment, Step, Trajectory

ROOT = Path(__file__).resolve().parents[1]


def test_one_tokenizer_loader_sets_pad_token_everywhere(tmp_path):
    """A saved tokenizer without a pad token gets EOS as pad from every entry point (the
    evaluation's OpenAI tokenizer, the demo's, the oracle's), because they are the same function."""
    from r3rag.demo.policies import load_tokenizer as demo_load
    from r3rag.evaluation import components, methods
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.tiny_tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok")).pad_token == "<|im_end|>"
    assert demo_load(str(tmp_path / "tok")).pad_token == "<|im_end|>"
    cfg = EvaluationConfig.model_validate({"model": {"tokenizer": str(tmp_path / "tok")}})
    assert methods._oracle_tokenizer(cfg).pad_token == "<|im_end|>"
    assert not hasattr(components, "load_tokenizer")  # no second loader left behind
    with pytest.raises(ConfigError, match=r"^policy\.tokenizer: .*cannot load tokenizer"):
        demo_load(str(tmp_path / "missing"))


def test_parser_and_checker_share_the_end_of_turn_rule():
    """A turn ending in two end-of-turn tokens: the parser's answer and the checker agree it is clean."""
    from r3rag.rollout.tiny_tokenizer import build_tiny_tokenizer

    fmt = get_format("r3rag_steps", mode="chat", tokenizer=build_tiny_tokenizer())
    turn = "Step 1:\nThe problem analysis: known.\nThe final answer: Paris<|im_end|>\n<|im_end|>"
    assert fmt.parse_turn(turn, 0).answer == "Paris"
    traj = Trajectory("q", "?", "r3rag_steps", segments=[Segment("model", turn, [])], steps=[Step(0, answer="Paris")])
    assert format_violations(traj, FormatConfig()) == []
    tags = get_format("r1searcher_tags", mode="chat", tokenizer=build_tiny_tokenizer())
    assert tags.parse_turn("<think>x</think><answer> Paris </answer><|im_end|> <|im_end|>", 0).answer == "Paris"


@register_format("test_bracket_search")
class BracketFormat(TrajectoryFormat):
    """A toy format registered here only: ``[search: q]`` and ``[answer: a]``; its one rule is
    that the answer must be in brackets."""

    chat_stop = raw_stop = ("]",)
    system_template = "r3rag_steps_system.txt"
    raw_template = "r3rag_steps_raw.txt"
    documents_marker = "[docs"

    def parse_turn(self, text, step_index):
        body = self._strip_end(text)
        for key, field in (("[search:", "query"), ("[answer:", "answer")):
            if key in body:
                return ParsedTurn("", **{field: body.split(key, 1)[1].rstrip("]").strip()})
        return ParsedTurn(body, error="no_marker")

    def render_turn(self, step_index, analysis, query=None, answer=None):
        return f"[search: {query}]" if query is not None else f"[answer: {answer}]"

    def render_documents(self, documents, step_index):
        return "[docs " + " ".join(p.contents for p in documents) + "]"

    @classmethod
    def format_violations(cls, traj, cfg):
        text = "".join(s.text for s in traj.segments if s.role == "model")
        return [] if "[answer:" in text else [Violation("no_bracket_answer")]


def test_a_new_format_is_one_registered_class_for_the_rewards_too():
    ok = Trajectory("q", "?", "test_bracket_search", segments=[Segment("model", "[answer: Paris]", [])])
    bad = Trajectory("q", "?", "test_bracket_search", segments=[Segment("model", "Paris", [])])
    assert format_violations(ok, FormatConfig()) == []
    assert [v.name for v in format_violations(bad, FormatConfig())] == ["no_bracket_answer"]


def test_one_name_per_format():
    """The format's registered name is its only name: the reward rules, the rollout config and the
    evaluation method all use it; the old short names are refused with a hint."""
    from r3rag.evaluation.methods import METHODS, check_method

    for name in ("r3rag_steps", "r1searcher_tags"):
        assert name in FORMATS and name in METHODS
    with pytest.raises(ValueError, match=r"unknown trajectory format 'r3rag' \(did you mean 'r3rag_steps'\?\)"):
        format_violations(Trajectory("q", "?", "r3rag", steps=[Step(0, answer="x")]), FormatConfig())
    with pytest.raises(ConfigError, match=r"unknown method 'r1searcher' \(did you mean 'r1searcher_tags'\?\)"):
        check_method("r1searcher")
    with pytest.raises(ConfigError, match="unknown trajectory format 'r3rag'"):
        get_format("r3rag")


def _imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return mods


def test_production_code_does_not_import_the_test_helpers():
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "r3rag").rglob("*.py")
        if "testing" not in p.relative_to(ROOT / "r3rag").parts
        and any(m == "r3rag.testing" or m.startswith("r3rag.testing.") for m in _imports(p))
    ]
    assert offenders == []


def test_oracle_benchmark_is_a_top_level_program():
    """The oracle's command line moved from the library (``r3rag.rollout.oracle_eval``) to
    ``benchmark/oracle_eval.py``; what it builds on (``prepare_world``) is library code."""
    import importlib.util

    from r3rag.evaluation.components import prepare_world  # noqa: F401

    assert importlib.util.find_spec("r3rag.rollout.oracle_eval") is None
    r = subprocess.run([sys.executable, str(ROOT / "benchmark" / "oracle_eval.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--in-process" in r.stdout and "r3rag_steps" in r.stdout
