"""Evaluation: run any method on any dataset, compute every published metric, write reports.

- :mod:`~r3rag.evaluation.config`      ``EvaluationConfig`` (dataset, method, model, retriever, rollout, judge, run)
- :mod:`~r3rag.evaluation.datasets`    ``--dataset`` -> validated questions (subsets, hub/local copies, world, paths)
- :mod:`~r3rag.evaluation.methods`     the method registry: direct, rag, ircot, oracle and every trajectory format (r3rag_steps, r1searcher_tags)
- :mod:`~r3rag.evaluation.baselines`   the prompted baselines' loop (direct, standard RAG, IRCoT)
- :mod:`~r3rag.evaluation.runner`      resumable, sharded runs: ``run_evaluation(cfg, out_dir)``
- :mod:`~r3rag.evaluation.run_key`     the settings a run folder resumes on (a changed one is refused)
- :mod:`~r3rag.evaluation.predictions` the fsync'ed predictions JSONL and its crash repair
- :mod:`~r3rag.evaluation.failures`    questions a dead service left unanswered: never scored, counted apart, retried
- :mod:`~r3rag.evaluation.aggregate`   EM/F1/cover-EM/acc, judge, cut-at-k, breakdowns, bootstrap CIs
- :mod:`~r3rag.evaluation.report`      report.md, results.csv, PNG plots
- :mod:`~r3rag.evaluation.merge`       join shards; :mod:`~r3rag.evaluation.compare` runs side by side
- :mod:`~r3rag.evaluation.score`       re-score any system's prediction file
"""
