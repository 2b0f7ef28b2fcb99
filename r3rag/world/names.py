"""Invented names built from syllable tables.

Every name in the world is made of syllables (onset + vowel + optional coda), so no language
model can know anything about it: the only way to answer a question is to retrieve. The tables
give about 2,600 syllables, so two-syllable given names and two-to-three-syllable surnames span
billions of combinations; the builder still checks exact uniqueness with a set.

Near-duplicate names are made on purpose with :func:`near_duplicate`: the same given name and a
surname that differs in its final vowel ("Varnel Oskaro" / "Varnel Oskari"). BM25 tokenises them
as different words, a reader skimming them does not.

Work titles (films, novels) use ordinary English words, so different works share words with each
other and with ordinary passages: retrieval by title words is noisy, as it is for real films.
"""

from __future__ import annotations

import random

ONSETS = (
    "b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p",
    "pr", "qu", "r", "s", "st", "t", "tr", "v", "vr", "w", "z", "th", "sh", "ch", "",
)
VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "y")
CODAS = ("", "", "", "n", "l", "r", "s", "m", "th", "x", "nd", "rk")
FINAL_VOWELS = ("a", "e", "i", "o", "u", "y")

COUNTRY_SUFFIXES = ("ia", "land", "ar", "istan", "ovia", "esia")
CITY_SUFFIXES = ("", "", "", "ton", "burg", "vale", "mouth", "ford", "holm", "grad")
ORG_KINDS = (
    "Works", "Shipping Company", "Bank", "Institute", "Press", "Mining Company", "Railway",
    "Observatory", "Foundry", "Textile Mills", "Brewery", "Insurance Society", "Academy",
    "Film Studio", "Telegraph Company", "Glassworks",
)
TITLE_ADJECTIVES = (
    "Silent", "Broken", "Golden", "Hidden", "Last", "Northern", "Crimson", "Quiet", "Iron",
    "Distant", "Burning", "Frozen", "Forgotten", "Wandering", "Bitter", "Pale", "Hollow",
    "Secret", "Endless", "Scarlet", "Lonely", "Restless", "Winter", "Summer", "Shining",
    "Little", "Second", "Final", "Wild", "Gentle",
)
TITLE_NOUNS = (
    "Harbour", "River", "Garden", "Mirror", "Tower", "Road", "Lantern", "Orchard", "Bridge",
    "Shadow", "Island", "Letter", "Winter", "Mountain", "Voyage", "Crown", "Bell", "Station",
    "Valley", "Forest", "Window", "Promise", "Storm", "Rose", "Ship", "House", "Hour", "Field",
    "Song", "Stranger", "Season", "Coast", "Fire", "Door", "Clock", "Sea",
)
TITLE_PATTERNS = (
    "The {a} {n}", "The {n} of {m}", "{a} {n}", "A {n} in {m}", "The {a} {n}s",
    "{n} and {m}", "Beyond the {n}", "The {n} at {m}",
)


def syllable(rng: random.Random) -> str:
    return rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)


def word(rng: random.Random, n_syllables: int, final_vowel: bool = False) -> str:
    """A capitalised invented word of ``n_syllables`` syllables (optionally ending in a vowel)."""
    w = ""
    while len(w) < 4:  # no two-letter words that could read as English ("He", "Oy")
        w = "".join(syllable(rng) for _ in range(n_syllables))
        if final_vowel:
            w = w.rstrip("aeiouy") + rng.choice(FINAL_VOWELS)
    return w[:1].upper() + w[1:]


def given_name(rng: random.Random) -> str:
    return word(rng, 2)


def surname(rng: random.Random) -> str:
    # Surnames end in a vowel so that near_duplicate can swap it ("Oskaro" / "Oskari").
    return word(rng, rng.choice((2, 2, 3)), final_vowel=True)


def person_name(rng: random.Random, family: str | None = None) -> str:
    return f"{given_name(rng)} {family or surname(rng)}"


def near_duplicate(name: str, rng: random.Random) -> str:
    """``name`` with its last word's final vowel changed: a near-identical but distinct name."""
    head, _, last = name.rpartition(" ")
    options = [v for v in FINAL_VOWELS if not last.endswith(v)]
    last = last.rstrip("aeiouy") + rng.choice(options)
    return f"{head} {last}" if head else last


def country_name(rng: random.Random) -> str:
    return word(rng, 2).rstrip("aeiouy") + rng.choice(COUNTRY_SUFFIXES)


CITY_DERIVED = ("New {s}", "Port {s}", "Upper {s}", "{s} Heights", "{s} Falls", "East {s}")


def city_name(rng: random.Random, stem: str | None = None) -> str:
    """An invented town, or one derived from a neighbour's name ("Port Tessaly" beside "Tessaly")."""
    if stem:
        return rng.choice(CITY_DERIVED).format(s=stem)
    return word(rng, rng.choice((1, 2, 2))) + rng.choice(CITY_SUFFIXES)


def org_name(rng: random.Random, stem: str | None = None) -> str:
    """An organisation: a stem (a town's name, or an invented word) plus a kind ("Quorvin Bank")."""
    return f"{stem or word(rng, 2)} {rng.choice(ORG_KINDS)}"


def work_title(rng: random.Random) -> str:
    pattern = rng.choice(TITLE_PATTERNS)
    n = rng.choice(TITLE_NOUNS)
    m = rng.choice([x for x in TITLE_NOUNS if x != n])
    return pattern.format(a=rng.choice(TITLE_ADJECTIVES), n=n, m=m)


def acronym(name: str) -> str | None:
    """Initials of a name of three or more words ("Quorvin Shipping Company" -> "QSC")."""
    words = [w for w in name.split() if w[:1].isupper()]
    return "".join(w[0] for w in words) if len(words) >= 3 else None
