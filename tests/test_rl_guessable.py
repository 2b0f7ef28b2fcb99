"""train.skip_guessable: yes/no questions and two-way choices are left out of the RL prompts."""

from __future__ import annotations

import pytest

from r3rag.data.records import Question
from r3rag.errors import ConfigError
from r3rag.train.rl.guessable import drop_guessable, is_guessable
from tests.rl_helpers import EvenTokenReward, tiny_cfg, tiny_trainer

YESNO = Question("y1", "Were Varnel Oskaro and Tirra Olle born in the same town?", ["Yes"], {"type": "yesno"})
NO = Question("y2", "Is Quessa in the province of Dromel?", ["no"], {"type": "yesno"})
CHOICE = Question("c1", "Which was founded first, Melvane Works or the Quessa Mill?", ["Melvane Works"], {"type": "comparison"})
BRIDGE = Question("b1", "In which province is the birthplace of Varnel Oskaro?", ["Dromel"], {"type": "bridge"})
# an "or" question whose gold is not one of its options is not a guess between them
OPEN_OR = Question("o1", "Who founded Melvane Works or its parent company?", ["Tirra Olle"], {"type": "bridge"})
# the gold written in the question, but no choice offered
NAMED = Question("n1", "Which town is Quessa's twin town, Quessa being in Dromel?", ["Quessa"])


@pytest.mark.parametrize(("q", "expected"), [(YESNO, True), (NO, True), (CHOICE, True), (BRIDGE, False),
                                             (OPEN_OR, False), (NAMED, False)])
def test_is_guessable(q, expected):
    assert is_guessable(q) is expected


def test_a_mixed_yes_no_gold_list_is_not_a_yes_no_question():
    assert not is_guessable(Question("m", "What did the sign say?", ["yes", "Keep out"]))
    assert not is_guessable(Question("e", "Is it?", [" "]))  # no usable gold: nothing to guess


def test_drop_guessable_keeps_order_and_counts_by_type():
    kept, dropped = drop_guessable([YESNO, BRIDGE, CHOICE, OPEN_OR, NO])
    assert [q.id for q in kept] == ["b1", "o1"]
    assert dropped == {"yesno": 2, "comparison": 1}


def _recording(seen):
    inner = EvenTokenReward()

    def reward(trajs):
        seen.extend(t.question_id for t in trajs)
        return inner(trajs)

    return reward


def _questions():
    # 12 prompts, 8 of them guessable: an iteration of 4 prompts draws some of them unless they are skipped
    out = []
    for i in range(4):
        out += [Question(f"y{i}", f"Was person {i} born in Quessa?", ["yes" if i % 2 else "no"], {"type": "yesno"}),
                Question(f"c{i}", f"Who was born first, person {i} or Tirra Olle?", [f"person {i}"], {"type": "comparison"}),
                Question(f"b{i}", f"Where was person {i} born?", ["Quessa"], {"type": "bridge"})]
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_the_trainer_rolls_out_only_the_questions_it_keeps(tmp_path, skip):
    cfg = tiny_cfg("group_norm", iterations=3)
    cfg.train.skip_guessable = skip
    seen: list[str] = []
    t = tiny_trainer(cfg, tmp_path, reward=_recording(seen))
    t._questions = _questions()
    t.run()
    assert len(seen) == 3 * 4 * 4  # 3 iterations x 4 prompts x 4 samples
    kinds = {qid[0] for qid in seen}
    if skip:
        assert kinds == {"b"}
        assert {q.id for q in t.questions} == {"b0", "b1", "b2", "b3"}
        assert "8 guessable training questions left out (comparison 4, yesno 4)" in t.skipped_note
    else:
        assert kinds > {"b"}  # the same order without the option draws guessable prompts


def test_nothing_left_to_train_on_is_a_config_error(tmp_path):
    cfg = tiny_cfg("group_norm", iterations=1)
    cfg.train.skip_guessable = True
    t = tiny_trainer(cfg, tmp_path)
    t._questions = [YESNO, NO, CHOICE]
    with pytest.raises(ConfigError, match="every one of the 3 training questions is guessable"):
        t.run()
