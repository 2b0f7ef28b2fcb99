"""Evaluation: scoring prediction files, and (later) running methods over datasets."""
