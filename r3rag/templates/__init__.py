"""Prompt templates shipped with r3rag (plain text files a user can replace by path)."""
