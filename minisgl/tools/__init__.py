"""Command-line tools (``python -m minisgl.tools.<name>``), and the one helper two of them share."""

import re


def without_code_blocks(markdown: str) -> str:
    """Markdown with its fenced code blocks dropped: the prose that quant_accuracy scores and that
    eagle_data builds its prompts from."""
    return re.sub(r"```.*?```", "", markdown, flags=re.S)
