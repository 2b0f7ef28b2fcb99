"""Wikipedia-style passages for one cluster: gold passages that state facts, and distractors.

Gold passages. Every entity gets a page (a person gets two chunks: a lead and a "later life"
chunk, both titled with the name, as a chunked Wikipedia article would be). Each fact is stated
in exactly one passage, its *home* (the ``passage_id`` in the relation table), in one of three ways:

- literally, with the question's key word (``"{x} was born in {y}"``), probability ``LITERAL``;
- paraphrased (``"{x} is a native of {y}"``), so the sub-question's words do not match it;
- inversely, on the object's page (``"{y} made the film {x}"`` on the director's page), for
  relations that have an inverse form, probability ``INVERSE``.

On an entity's own page a sentence-initial name becomes "He", "She" or "The company" with
probability ``PRONOUN`` (as Wikipedia writes), so the name occurs mainly in the title.

Distractors, so that a teacher copying gold sub-questions into BM25 is imperfect:

- *rumours*: passages that repeat a sub-question almost word for word about the same subject,
  with a wrong candidate and a denial ("A plaque in Tessaly claims that Varnel Oskaro was born
  there, but historians reject it."). They match the literal query better than a paraphrased
  gold passage;
- *name lists*: "Varnel (given name)" pages listing near-namesakes side by side, and family
  pages listing relatives, which share every name token with the gold page;
- *near-namesakes* (p8, p9 of the roster) are full entities with their own true facts;
- *genre lists* ("Cinema of Quorvania") that use "released"/"published" without dates.

Filler sentences in common words vary passage lengths the way real pages do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from r3rag.world.generator import Cluster, Entity, Fact, format_date
from r3rag.world.names import ORG_KINDS, TITLE_NOUNS
from r3rag.world.schema import RELATIONS

LITERAL = 0.25
INVERSE = 0.3
PRONOUN = 0.5
RUMOURS_PER_CLUSTER = 14
SUBJECT_NOUNS = {"org": "The company", "film": "The film", "novel": "The novel", "city": "The town"}

RUMOURS = {
    "born_in": "A plaque in {z} claims that {x} was born there, but historians reject it.",
    "birth_date": "Some almanacs wrongly state that {x} was born on {z}.",
    "spouse": "Rumours that {x} was married to {z} were never confirmed.",
    "father": "A forged letter names {z} as the father of {x}.",
    "employer": "{x} is often said to have worked for {z}, though no record of it survives.",
    "founded_by": "It is a common error to say that {x} was founded by {z}.",
    "founded_year": "A sign outside claims {x} was founded in {z}, a date the archives do not support.",
    "headquarters": "Despite the rumour, {x} is not headquartered in {z}.",
    "located_in": "{x} is sometimes mistakenly said to be located in {z}.",
    "directed_by": "Early posters said {x} was directed by {z}, an error corrected later.",
    "release_year": "{x} was announced to be released in {z}, but the premiere was delayed.",
    "written_by": "A pirated edition claimed that {x} was written by {z}.",
    "publication_year": "{x} was meant to be published in {z}, but the printer went bankrupt.",
}
RUMOUR_TITLES = ("Myths about {x}", "Legends of {c}", "Errata of the {k} Almanac", "{x} (disputed claims)")
FILLERS = (
    "{P} was known for a quiet manner and a sharp memory.",
    "Contemporaries remembered {o} as generous to friends and hard on rivals.",
    "A portrait of {o} hangs in a provincial museum.",
    "Letters written by {o} were collected after {q} death.",
    "{P} travelled widely in middle age.",
)
ORG_FILLERS = (
    "Its archive was opened to researchers in the twentieth century.",
    "The organisation survived two fires and a flood.",
    "Its early years were marked by debt.",
)
WORK_FILLERS = (
    "Critics were divided at first.",
    "It was restored and reissued decades later.",
    "The story follows a family over three generations.",
)
PRONOUNS = {"m": ("he", "his", "him"), "f": ("she", "her", "her"), "n": ("it", "its", "it")}


@dataclass
class Draft:
    """A passage before it has an id: a title, sentences, and the facts it is home to."""

    title: str
    sentences: list[str]
    facts: list[Fact] = field(default_factory=list)

    def contents(self) -> str:
        return f"{self.title}\n{' '.join(self.sentences)}"


def refer_back(template: str, subject: Entity) -> str:
    """Replace a sentence-initial subject name by a pronoun or "The company" (its own page)."""
    if not template.startswith("{x}"):
        return template
    if subject.kind == "person":
        return template.replace("{x}'s", "{Q}", 1).replace("{x}", "{P}", 1)
    noun = SUBJECT_NOUNS.get(subject.kind, "It")
    return template.replace("{x}'s", noun + "'s", 1).replace("{x}", noun, 1)


def fill(template: str, subject: Entity, **values: str) -> str:
    p, q, o = PRONOUNS[subject.gender]
    out = template.format(P=p.capitalize(), p=p, q=q, Q=q.capitalize(), o=o, **values)
    return out[:1].upper() + out[1:]


def _lead(e: Entity, cluster: Cluster, rng: random.Random) -> str:
    country = cluster.entities["k0" if rng.random() < 0.5 else "k1"].name
    if e.kind == "person":
        return f"{e.name} was a {e.occupation}."
    if e.kind == "org":
        kind = next((k for k in ORG_KINDS if e.name.endswith(k)), "company").lower()
        return f"{e.name} is a {kind}."
    if e.kind == "film":
        return f"{e.name} is a feature film."
    if e.kind == "novel":
        return f"{e.name} is a novel."
    if e.kind == "city":
        return f"{e.name} is a market town known for its {rng.choice(TITLE_NOUNS).lower()}s."
    return f"{e.name} is a country bordering {country if country != e.name else 'the sea'}."


def _fillers(e: Entity, rng: random.Random) -> list[str]:
    pool = FILLERS if e.kind == "person" else ORG_FILLERS if e.kind == "org" else WORK_FILLERS
    if e.kind in ("city", "country"):
        return []
    return [fill(t, e) for t in rng.sample(pool, rng.randint(0, 2))]


def render_cluster(cluster: Cluster, seed: int) -> list[Draft]:
    """All passages of a cluster (shuffled); every fact's home passage is among them."""
    rng = random.Random(f"{seed}:{cluster.index}:corpus")
    ents = cluster.entities
    by_id = cluster.by_id()
    pages: dict[str, list[Draft]] = {}
    for slot, e in ents.items():
        pages[slot] = [Draft(e.name, [_lead(e, cluster, rng)])]
        if e.kind == "person":
            pages[slot].append(Draft(e.name, []))

    for e in ents.values():
        for fact in e.facts.values():
            rel = RELATIONS[fact.relation]
            obj = by_id.get(fact.obj) if fact.obj else None
            if rel.inverse and obj is not None and rng.random() < INVERSE:
                sentence = fill(rng.choice(rel.inverse), obj, x=e.name, y=fact.value)
                page = rng.choice(pages[obj.slot])
            else:
                pool = rel.literal if rng.random() < LITERAL else rel.paraphrase
                template = rng.choice(pool)
                if rng.random() < PRONOUN:
                    template = refer_back(template, e)
                sentence = fill(template, e, x=e.name, y=fact.value)
                page = rng.choice(pages[e.slot])
            page.sentences.append(sentence)
            page.facts.append(fact)

    drafts: list[Draft] = []
    for slot, e in ents.items():
        for i, page in enumerate(pages[slot]):
            head, body = (page.sentences[:1], page.sentences[1:]) if i == 0 else ([], page.sentences)
            body.extend(_fillers(e, rng))
            rng.shuffle(body)  # the order of facts within a page varies
            page.sentences = head + body
            if not page.sentences:
                page.sentences.append(fill(rng.choice(FILLERS), e))
            drafts.append(page)
    drafts.extend(_distractors(cluster, rng))
    rng.shuffle(drafts)
    return drafts


def _wrong_value(fact: Fact, cluster: Cluster, rng: random.Random) -> str | None:
    """A plausible wrong answer for ``fact`` (same kind, different value), or None."""
    if fact.relation == "birth_date":
        y, m, d = fact.key  # type: ignore[misc]
        return format_date(y + rng.choice((-2, -1, 1, 2)), m, d)
    if RELATIONS[fact.relation].object == "year":
        return str(int(fact.value) + rng.choice((-3, -1, 1, 4)))
    kind = RELATIONS[fact.relation].object
    options = [e.name for e in cluster.entities.values() if e.kind == kind and e.id != fact.obj
               and e.id != fact.subject]
    return rng.choice(options) if options else None


def _distractors(cluster: Cluster, rng: random.Random) -> list[Draft]:
    ents = cluster.entities
    out: list[Draft] = []
    facts = [f for e in ents.values() if e.kind != "country" for f in e.facts.values()]
    by_id = cluster.by_id()
    for fact in rng.sample(facts, min(RUMOURS_PER_CLUSTER, len(facts))):
        wrong = _wrong_value(fact, cluster, rng)
        if wrong is None:
            continue
        subject = by_id[fact.subject]
        title = rng.choice(RUMOUR_TITLES).format(
            x=subject.name, c=ents[rng.choice(("c0", "c1", "c2", "c3"))].name,
            k=ents[rng.choice(("k0", "k1"))].name)
        out.append(Draft(title, [fill(RUMOURS[fact.relation], subject, x=subject.name, z=wrong)]))

    for slot, twin in (("p2", "p8"), ("p6", "p9")):  # given-name pages with the near-namesakes
        a, b = ents[slot], ents[twin]
        given = a.name.split(" ", 1)[0]
        people = [a, b]
        rng.shuffle(people)
        listed = ", ".join(f"{p.name} ({p.facts['birth_date'].key[0]}), a {p.occupation}" for p in people)
        out.append(Draft(f"{given} (given name)", [f"{given} is a given name.", f"People with the name include {listed}."]))
    for head, members in (("p0", ("p0", "p2", "p5", "p6")), ("p1", ("p1", "p3", "p4", "p7"))):
        family = ents[head].name.rsplit(" ", 1)[1]
        listed = ", ".join(ents[m].name for m in members)
        country = ents[rng.choice(("k0", "k1"))].name
        out.append(Draft(f"{family} family", [
            f"The {family} family has been recorded in {country} for two centuries.",
            f"Its known members include {listed}."]))
    for kind, noun, verb in (("film", "Cinema", "released"), ("novel", "Literature", "published")):
        works = [e for e in ents.values() if e.kind == kind]
        country = ents[rng.choice(("k0", "k1"))].name
        out.append(Draft(f"{noun} of {country}", [
            f"Works {verb} in {country} include {works[0].name} and {works[1].name}.",
            "Both found an audience abroad."]))
    return out
