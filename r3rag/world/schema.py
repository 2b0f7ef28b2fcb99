"""The world's vocabulary: entity kinds, typed relations and how each is asked and stated.

A relation is a function from a subject entity to an object (another entity or a value such as a
date). For each relation this module records

- ``ask``: the sub-question that retrieves it, with ``{x}`` for the subject ("Where was {x} born?");
- ``phrase``: a noun phrase naming the object, used to compose multi-hop questions
  ("the director of {x}" -> "Where was the director of The Silent Harbour born?");
- ``literal``: passage sentences that reuse the question's key word ("was born in");
- ``paraphrase``: sentences that state the same fact in other words ("is a native of"), so a
  query copied from the question does not match them well: the reason a search strategy that
  reformulates can beat one that copies the gold decomposition;
- ``inverse``: sentences stating the fact from the object's side, placed in the object's
  passage ("{y} directed {x}"), so the gold passage is not the subject's own page.

Sentence templates take ``{x}`` (subject), ``{y}`` (object) and the subject's pronouns
``{P}``/``{p}`` (he, she), ``{Q}``/``{q}`` (his, her) and ``{o}`` (him, her). Every template contains ``{y}`` verbatim, which is what lets the
validator check that a step's answer appears in its supporting passage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GENERATOR_VERSION = "1.0.0"

# Entity kinds; the value is the answer_type of a question whose answer is such an entity.
KINDS = {
    "person": "person",
    "city": "place",
    "country": "place",
    "org": "organisation",
    "film": "work",
    "novel": "work",
}
QUESTION_TYPES = ("single", "bridge", "comparison", "yesno", "compositional", "inference")
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Relation:
    name: str
    subject: str  # entity kind
    object: str  # entity kind, or "date" / "year" for values
    ask: tuple[str, ...]
    phrase: str | None
    literal: tuple[str, ...]
    paraphrase: tuple[str, ...]
    inverse: tuple[str, ...] = field(default=())

    @property
    def is_value(self) -> bool:
        return self.object in ("date", "year")

    @property
    def answer_type(self) -> str:
        return self.object if self.is_value else KINDS[self.object]


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation(
            "born_in", "person", "city",
            ask=("Where was {x} born?", "In which city was {x} born?"),
            phrase="the birthplace of {x}",
            literal=("{x} was born in {y}.", "{P} was born in the city of {y}."),
            paraphrase=("{x} is a native of {y}.", "{P} came into the world in {y}.",
                        "{x} spent {q} childhood in {y}, where {p} had first drawn breath."),
        ),
        Relation(
            "birth_date", "person", "date",
            ask=("When was {x} born?", "What is the date of birth of {x}?"),
            phrase=None,
            literal=("{x} was born on {y}.",),
            paraphrase=("{x}'s life began on {y}.", "{P} arrived on {y}, the eldest of five.",
                        "Parish records date {x}'s arrival to {y}."),
        ),
        Relation(
            "spouse", "person", "person",
            ask=("Who was {x} married to?", "Who is the spouse of {x}?"),
            phrase="the spouse of {x}",
            literal=("{x} was married to {y}.",),
            paraphrase=("{x} wed {y} in a small ceremony.", "{P} shared {q} later life with {y}.",
                        "{x} and {y} exchanged vows in spring."),
        ),
        Relation(
            "father", "person", "person",
            ask=("Who is the father of {x}?", "Who was {x}'s father?"),
            phrase="the father of {x}",
            literal=("The father of {x} was {y}.",),
            paraphrase=("{x} was raised by {y}, {q} papa.", "{x} was a child of {y}.",
                        "{P} inherited {q} stubbornness from {y}, who sired {o}."),
            inverse=("{y} had a child, {x}.",),
        ),
        Relation(
            "employer", "person", "org",
            ask=("Which organisation did {x} work for?", "Who employed {x}?"),
            phrase="the employer of {x}",
            literal=("{x} worked for {y}.", "{P} was employed by {y}."),
            paraphrase=("{x} spent {q} career at {y}.", "{P} joined the staff of {y}.",
                        "{x} drew a salary from {y} for many years."),
            inverse=("Among the staff of {y} was {x}.",),
        ),
        Relation(
            "founded_by", "org", "person",
            ask=("Who founded {x}?", "Who was the founder of {x}?"),
            phrase="the founder of {x}",
            literal=("{x} was founded by {y}.",),
            paraphrase=("{x} was established by {y}.", "{x} owes its existence to {y}.",
                        "{y} set up {x} with borrowed money."),
            inverse=("{y} created {x}.", "{y} started {x} with a small loan."),
        ),
        Relation(
            "founded_year", "org", "year",
            ask=("When was {x} founded?", "In what year was {x} founded?"),
            phrase=None,
            literal=("{x} was founded in {y}.",),
            paraphrase=("{x} opened its doors in {y}.", "{x} has operated since {y}.",
                        "The first ledger of {x} is dated {y}."),
        ),
        Relation(
            "headquarters", "org", "city",
            ask=("Where is {x} headquartered?", "In which city is {x} based?"),
            phrase="the city where {x} is headquartered",
            literal=("{x} is headquartered in {y}.",),
            paraphrase=("{x} keeps its main offices in {y}.", "The head office of {x} stands in {y}.",
                        "{x} runs its affairs from {y}."),
        ),
        Relation(
            "located_in", "city", "country",
            ask=("In which country is {x}?", "Which country is {x} located in?"),
            phrase="the country of {x}",
            literal=("{x} is a city located in {y}.",),
            paraphrase=("{x} is a town in the north of {y}.", "{x} lies on the river plain of {y}.",
                        "{x} sits near the border of {y}."),
        ),
        Relation(
            "directed_by", "film", "person",
            ask=("Who directed {x}?", "Who is the director of {x}?"),
            phrase="the director of {x}",
            literal=("{x} was directed by {y}.",),
            paraphrase=("{x} is a film by {y}.", "{x} was made by {y} on a modest budget.",
                        "{y} stood behind the camera for {x}."),
            inverse=("{y} made the film {x}.", "{y}'s pictures include {x}."),
        ),
        Relation(
            "release_year", "film", "year",
            ask=("When was {x} released?", "In what year was {x} released?"),
            phrase=None,
            literal=("{x} was released in {y}.",),
            paraphrase=("{x} premiered in {y}.", "{x} reached cinemas in {y}.",
                        "Audiences first saw {x} in {y}."),
        ),
        Relation(
            "written_by", "novel", "person",
            ask=("Who wrote {x}?", "Who is the author of {x}?"),
            phrase="the author of {x}",
            literal=("{x} was written by {y}.",),
            paraphrase=("{x} is a novel by {y}.", "{x} came from the pen of {y}.",
                        "{y} spent six years drafting {x}."),
            inverse=("{y} penned {x}.", "{y}'s books include {x}."),
        ),
        Relation(
            "publication_year", "novel", "year",
            ask=("When was {x} published?", "In what year was {x} published?"),
            phrase=None,
            literal=("{x} was published in {y}.",),
            paraphrase=("{x} first appeared in print in {y}.", "{x} reached bookshops in {y}.",
                        "The first edition of {x} is dated {y}."),
        ),
    )
}

# Two-hop paths that 2WikiMultiHopQA calls "inference": a named relation implied by two others.
INFERRED = {
    ("spouse", "father"): ("Who is the father-in-law of {x}?", "father_in_law"),
    ("father", "father"): ("Who is the paternal grandfather of {x}?", "paternal_grandfather"),
}

# Comparisons: (relation on each candidate, question templates with {a} and {b}, op).
COMPARISONS = (
    ("birth_date", "Who was born first, {a} or {b}?", "earlier"),
    ("birth_date", "Who was born later, {a} or {b}?", "later"),
    ("founded_year", "Which organisation was founded first, {a} or {b}?", "earlier"),
    ("release_year", "Which film came out first, {a} or {b}?", "earlier"),
    ("publication_year", "Which novel was published more recently, {a} or {b}?", "later"),
)
# Yes/no questions: (path followed from each candidate, question template, op).
YESNO = (
    (("born_in",), "Were {a} and {b} born in the same city?", "same"),
    (("born_in", "located_in"), "Were {a} and {b} born in the same country?", "same"),
    (("headquarters",), "Are {a} and {b} headquartered in the same city?", "same"),
    (("headquarters", "located_in"), "Are {a} and {b} based in the same country?", "same"),
    (("release_year",), "Was {a} released before {b}?", "before"),
    (("birth_date",), "Was {a} born before {b}?", "before"),
)
# Bridge comparisons (2Wiki "bridge_comparison", four hops): compare a fact about a related entity.
BRIDGE_COMPARISONS = (
    (("directed_by", "birth_date"), "Which film has the director who was born first, {a} or {b}?", "earlier"),
    (("written_by", "birth_date"), "Which novel has the author who was born later, {a} or {b}?", "later"),
    (("founded_by", "birth_date"), "Which organisation has the older founder, {a} or {b}?", "earlier"),
)

# Two-hop chains ending in a country read naturally as 2Wiki "compositional" questions.
COMPOSED_PHRASES = {
    ("born_in", "located_in"): "In which country was {x} born?",
    ("headquarters", "located_in"): "In which country is {x} headquartered?",
}


@dataclass(frozen=True)
class SizeSpec:
    """How many clusters a size has and how many questions each cluster contributes on average."""

    clusters: int
    questions_per_cluster: float
    description: str


SIZES: dict[str, SizeSpec] = {
    "tiny": SizeSpec(8, 12.0, "about 400 passages and 100 questions (tests, demos)"),
    "small": SizeSpec(38, 26.5, "about 2k passages and 1k questions, builds in about a second"),
    "medium": SizeSpec(940, 10.0, "about 50k passages and 9k questions"),
    "large": SizeSpec(18900, 1.06, "about 1M passages and 20k questions (performance benchmarks)"),
}
