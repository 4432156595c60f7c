"""Which layers a checkpoint's ignore list keeps in float.

Mirrors python/sglang/srt/layers/quantization/compressed_tensors/utils.py (should_ignore_layer,
check_equal_or_regex_match), which SGLang's W8A8Int8Config also calls. An ignore entry matches a
module name (as the checkpoint spells it) that contains it, case aside ("down_proj" is every
down_proj), or is ``re:`` and a regular expression matched from the name's start. A
checkpoint stores a fused layer's parts apart (q_proj, k_proj and v_proj for minisgl's qkv_proj),
so a fused layer is ignored when its parts are, and a list naming only some parts is an error: one
GEMM cannot run half in int8.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping


def packed_modules_mapping(model) -> dict[str, list[str]]:
    """A model's fused modules and the checkpoint parts each is loaded from, from its
    stacked_params_mapping: {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": [...]}
    (SGLang's models declare this dict as packed_modules_mapping)."""
    mapping: dict[str, list[str]] = {}
    for fused, part, _ in getattr(model, "stacked_params_mapping", ()):
        mapping.setdefault(fused, []).append(part)
    return mapping


def check_equal_or_regex_match(layer_name: str, targets: Iterable[str]) -> bool:
    """Whether any target is contained in layer_name, or is a ``re:`` pattern matching it from the start."""
    return any(
        re.match(target[len("re:") :], layer_name) if target.startswith("re:") else target.lower() in layer_name.lower()
        for target in targets
    )


def should_ignore_layer(layer_name: str, ignore: Iterable[str], fused_mapping: Mapping[str, list[str]]) -> bool:
    """Whether `layer_name` (a module of the built model) is one the ignore list keeps in float.
    `fused_mapping` maps a fused module's last name to its parts' (qkv_proj -> q_proj, k_proj, v_proj)."""
    ignore = list(ignore)
    proj_name = layer_name.rsplit(".", 1)[-1]
    if proj_name not in fused_mapping or layer_name in ignore:
        return check_equal_or_regex_match(layer_name, ignore)
    prefix = layer_name[: -len(proj_name)]
    shards = {part: check_equal_or_regex_match(prefix + part, ignore) for part in fused_mapping[proj_name]}
    if len(set(shards.values())) > 1:
        raise ValueError(
            f"the ignore list keeps {sorted(p for p, kept in shards.items() if kept)} of {layer_name} in float but not "
            f"{sorted(p for p, kept in shards.items() if not kept)}: the parts of a fused layer share one scheme"
        )
    return next(iter(shards.values()))
