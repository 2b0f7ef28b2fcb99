"""Entities and facts of the world, generated cluster by cluster.

The world is a sequence of independent *clusters* (think of a small region with its own history).
Every cluster has the same roster of slots:

- 2 countries, 4 cities (two in each country);
- 10 people: two founders of families (p0, p1), their children (p2..p5, married as p2-p3 and
  p4-p5), grandchildren (p6, p7) named after their grandfathers (same given name and surname,
  plus a middle name), and two *near-namesakes* (p8, p9) whose names differ from p2's and p6's
  by one letter;
- 3 organisations, two of them named after the same town, 2 films, 2 novels;
- town names derived from each other ("Tessaly", "Port Tessaly").

These shared name tokens are what makes BM25 confuse entities, as it does on real Wikipedia.

Relations only link entities of the same cluster, and a whole cluster goes to one split
(train/dev/test), which is how the builder guarantees that no entity of a question's answer chain
appears in another split. Each cluster draws from its own ``random.Random`` seeded with a string
``"{seed}:{cluster}:..."`` (string seeds are hashed with SHA-512, independent of PYTHONHASHSEED),
so the world is byte-identical for a seed and a cluster can be generated without the others.

Names are drawn in a first pass over all clusters (:func:`draw_cluster_names`) so that they are
unique world-wide and so that a surname is offered as an answer alias only when exactly one person
in the whole world carries it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from r3rag.world import names as nm
from r3rag.world.schema import RELATIONS, SPLITS

MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
OCCUPATIONS = (
    "painter", "engineer", "chemist", "film director", "novelist", "banker", "architect",
    "composer", "shipbuilder", "physician", "journalist", "astronomer", "merchant", "poet",
)

# slot -> kind, in drawing order (cities before organisations, which may be named after them)
ROSTER: tuple[tuple[str, str], ...] = (
    ("k0", "country"), ("k1", "country"),
    ("c0", "city"), ("c1", "city"), ("c2", "city"), ("c3", "city"),
    *((f"p{i}", "person") for i in range(10)),
    ("o0", "org"), ("o1", "org"), ("o2", "org"),
    ("f0", "film"), ("f1", "film"), ("n0", "novel"), ("n1", "novel"),
)
FATHERS = {"p2": "p0", "p5": "p0", "p3": "p1", "p4": "p1", "p6": "p2", "p7": "p4"}
SPOUSES = (("p2", "p3"), ("p4", "p5"))
NEAR_NAMESAKES = {"p8": "p2", "p9": "p6"}
NAMED_AFTER = {"p6": "p0", "p7": "p1"}  # grandchildren share their grandfather's given name
CITY_STEMS = {"c1": "c0", "c3": "c2"}  # "Port Tessaly" beside "Tessaly"
ORG_STEMS = {"o0": "c0", "o1": "c0"}  # "Tessaly Bank" and "Tessaly Press" beside the town
MALE = ("p0", "p1", "p2", "p4")
FEMALE = ("p3", "p5")


@dataclass
class Fact:
    """One row of the relation table: ``relation(subject) = value`` (``obj``: the object's id)."""

    subject: str
    subject_name: str
    relation: str
    obj: str | None
    value: str
    key: tuple[int, ...] | str  # sortable form of the value, used by comparisons
    passage_id: str = ""

    def to_dict(self) -> dict[str, str | None]:
        return {
            "subject": self.subject,
            "subject_name": self.subject_name,
            "relation": self.relation,
            "object": self.obj,
            "value": self.value,
            "passage_id": self.passage_id,
        }


@dataclass
class Entity:
    id: str
    slot: str
    kind: str
    name: str
    cluster: int
    gender: str = "n"  # "m", "f" or "n" (not a person)
    occupation: str = ""
    facts: dict[str, Fact] = field(default_factory=dict)


@dataclass
class Cluster:
    index: int
    split: str
    entities: dict[str, Entity]  # by slot

    def by_id(self) -> dict[str, Entity]:
        return {e.id: e for e in self.entities.values()}


def split_of(cluster: int) -> str:
    """Clusters 0-7 of every ten go to train, 8 to dev, 9 to test (balanced at every size)."""
    r = cluster % 10
    return SPLITS[0] if r < 8 else SPLITS[1] if r == 8 else SPLITS[2]


def entity_id(cluster: int, slot_index: int) -> str:
    return f"e{cluster:06d}{slot_index:02d}"


def format_date(year: int, month: int, day: int) -> str:
    return f"{day} {MONTHS[month - 1]} {year}"


def date_aliases(year: int, month: int, day: int) -> list[str]:
    """The canonical date first, then the US form; a bare year is deliberately not an alias."""
    return [format_date(year, month, day), f"{MONTHS[month - 1]} {day}, {year}"]


def _unique(draw, used: set[str], rng: random.Random, fallback) -> str:
    for _ in range(8):
        name = draw()
        if name not in used:
            break
    else:
        name = fallback()
        while name in used:
            name = fallback()
    used.add(name)
    return name


def draw_cluster_names(seed: int, cluster: int, used: set[str]) -> list[str]:
    """Pass one: the names of a cluster's slots (in ROSTER order), unique against ``used``."""
    rng = random.Random(f"{seed}:{cluster}:names")
    out: dict[str, str] = {}
    families: dict[str, str] = {}
    for slot, kind in ROSTER:
        if kind == "country":
            name = _unique(lambda: nm.country_name(rng), used, rng, lambda: nm.country_name(rng))
        elif kind == "city":
            stem = out.get(CITY_STEMS.get(slot, ""))
            name = _unique(lambda: nm.city_name(rng, stem), used, rng, lambda: nm.city_name(rng) + "holm")
        elif kind == "person":
            if slot in NEAR_NAMESAKES:
                base = out[NEAR_NAMESAKES[slot]]
                name = _unique(lambda: nm.near_duplicate(base, rng), used, rng, lambda: nm.person_name(rng))
            elif slot in NAMED_AFTER:  # a grandchild named after a grandfather, plus a middle name
                given = out[NAMED_AFTER[slot]].split(" ", 1)[0]
                family = families[FATHERS[slot]]
                name = _unique(lambda: f"{given} {nm.word(rng, 1)} {family}", used, rng,
                               lambda: nm.person_name(rng, family))
            else:
                family = families.get(FATHERS.get(slot, ""))
                name = _unique(lambda: nm.person_name(rng, family), used, rng, lambda: nm.person_name(rng))
            families[slot] = name.rsplit(" ", 1)[1]
        elif kind == "org":
            stem = out[ORG_STEMS[slot]] if slot in ORG_STEMS else None
            name = _unique(lambda: nm.org_name(rng, stem), used, rng,
                           lambda: nm.org_name(rng, nm.word(rng, 3)))
        else:  # film / novel: common-word titles first, an invented word when those are used up
            name = _unique(lambda: nm.work_title(rng), used, rng,
                           lambda: f"The {rng.choice(nm.TITLE_NOUNS)} of {nm.word(rng, 2)}")
        out[slot] = name
    return [out[slot] for slot, _ in ROSTER]


def _fact(e: Entity, relation: str, obj: Entity | None, value: str, key) -> None:
    e.facts[relation] = Fact(e.id, e.name, relation, obj.id if obj else None, value, key)


def _year_fact(e: Entity, relation: str, year: int) -> None:
    _fact(e, relation, None, str(year), (year,))


def build_cluster(seed: int, cluster: int, names: list[str]) -> Cluster:
    """Pass two: entities with their relations (facts) for one cluster."""
    rng = random.Random(f"{seed}:{cluster}:facts")
    ents: dict[str, Entity] = {}
    for i, ((slot, kind), name) in enumerate(zip(ROSTER, names)):
        ents[slot] = Entity(entity_id(cluster, i), slot, kind, name, cluster)
    for c in ("c0", "c1"):
        _fact(ents[c], "located_in", ents["k0"], ents["k0"].name, ents["k0"].name)
    for c in ("c2", "c3"):
        _fact(ents[c], "located_in", ents["k1"], ents["k1"].name, ents["k1"].name)
    cities = [ents[c] for c in ("c0", "c1", "c2", "c3")]
    orgs = [ents[o] for o in ("o0", "o1", "o2")]

    people = [ents[f"p{i}"] for i in range(10)]
    birth_year: dict[str, int] = {}
    for p in people:
        p.gender = "m" if p.slot in MALE else "f" if p.slot in FEMALE else rng.choice("mf")
        p.occupation = rng.choice(OCCUPATIONS)
        father = FATHERS.get(p.slot)
        year = birth_year[father] + rng.randint(22, 40) if father else rng.randint(1830, 1875)
        if p.slot in NEAR_NAMESAKES:  # a contemporary of the person it is easily confused with
            year = birth_year[NEAR_NAMESAKES[p.slot]] + rng.randint(-6, 6)
        birth_year[p.slot] = year
        month, day = rng.randint(1, 12), rng.randint(1, 28)
        _fact(p, "birth_date", None, format_date(year, month, day), (year, month, day))
        city = rng.choice(cities)
        _fact(p, "born_in", city, city.name, city.name)
        if rng.random() < 0.85:
            org = rng.choice(orgs)
            _fact(p, "employer", org, org.name, org.name)
    for child, father in FATHERS.items():
        _fact(ents[child], "father", ents[father], ents[father].name, ents[father].name)
    for a, b in SPOUSES:
        _fact(ents[a], "spouse", ents[b], ents[b].name, ents[b].name)
        _fact(ents[b], "spouse", ents[a], ents[a].name, ents[a].name)

    for o in orgs:
        founder = rng.choice(people)
        _fact(o, "founded_by", founder, founder.name, founder.name)
        _year_fact(o, "founded_year", birth_year[founder.slot] + rng.randint(20, 50))
        city = rng.choice(cities)
        _fact(o, "headquarters", city, city.name, city.name)
    for w, rel, year_rel in (("f0", "directed_by", "release_year"), ("f1", "directed_by", "release_year"),
                             ("n0", "written_by", "publication_year"), ("n1", "written_by", "publication_year")):
        # films and novels come from the younger generations, so that no film predates cinema
        maker = rng.choice([p for p in people if p.slot not in ("p0", "p1")])
        _fact(ents[w], rel, maker, maker.name, maker.name)
        _year_fact(ents[w], year_rel, birth_year[maker.slot] + rng.randint(25, 60))
    for e in ents.values():  # every fact's relation must be declared for the entity's kind
        for rel in e.facts:
            assert RELATIONS[rel].subject == e.kind, (rel, e.kind)
    return Cluster(cluster, split_of(cluster), ents)
