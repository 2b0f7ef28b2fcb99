"""The training quickstart as a pipeline of named, resumable stages (``python -m r3rag.quickstart``).

- :mod:`~r3rag.pipeline.config`: the preset's settings (``configs/quickstart/*.yaml``);
- :mod:`~r3rag.pipeline.state`: done markers, written atomically after a stage's outputs;
- :mod:`~r3rag.pipeline.runner`: runs stages in order, skips finished ones, always closes services;
- :mod:`~r3rag.pipeline.child`: training programs as child processes that never outlive it;
- :mod:`~r3rag.pipeline.stages`, :mod:`~r3rag.pipeline.training`: the stages by name;
- :mod:`~r3rag.pipeline.checks`: is a stage's output usable; the learning claims;
- :mod:`~r3rag.pipeline.report`: the table, paired differences, curves and examples.

Kept import-free: ``python -m r3rag.pipeline.child`` runs before every training program.
"""
