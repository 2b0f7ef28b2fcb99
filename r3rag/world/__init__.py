"""The embedded fictional multi-hop world: the default data of every r3rag command.

>>> from r3rag.world import build_world, validate_world, SIZES
>>> manifest = build_world("runs/world", seed=0, size="small")   # doctest: +SKIP
>>> validate_world("runs/world")                                  # doctest: +SKIP
[]

Modules: ``names`` (invented names), ``schema`` (relations, question shapes, sizes),
``generator`` (entities and facts per cluster), ``corpus`` (passages and distractors),
``questions`` (question samplers), ``build`` (streaming writer), ``validator``.
"""

from r3rag.world.build import FILES, build_world
from r3rag.world.schema import GENERATOR_VERSION, QUESTION_TYPES, SIZES
from r3rag.world.validator import validate_world

__all__ = ["FILES", "GENERATOR_VERSION", "QUESTION_TYPES", "SIZES", "build_world", "validate_world"]
