"""Constrained decoding: JSON schemas, regexes and EBNF grammars as a per-request vocab mask.

Mirrors python/sglang/srt/constrained/ (base_grammar_backend.py, xgrammar_backend.py,
grammar_manager.py). Only the xgrammar backend is implemented; SGLang also offers outlines
and llguidance, structural tags, jump-forward decoding and reasoning-aware grammars.
"""
