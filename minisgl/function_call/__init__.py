"""Tool calls: reading a model's function calls out of its text, and constraining it to make one.

Mirrors python/sglang/srt/function_call/: one detector per model family's call format
(qwen25_detector.py, llama32_detector.py, mistral_detector.py, pythonic_detector.py),
json_array_parser.py for the output that required and named tool choices are constrained
to, and function_call_parser.py, which picks a detector by --tool-call-parser. SGLang has
twenty-odd detectors; minisgl keeps these four formats.
"""
