"""C1: the Scheduler drives a TpModelWorker, never a ModelRunner or a model.
C10: no package reaches a layer above it through runtime imports, however indirectly: layers/
never reach models/, managers/, model_executor/ or speculative/; models/ never reach the
execution shell. Checked on the transitive import graph (imports under `if TYPE_CHECKING:` are
annotations, not dependencies, and are skipped)."""

import ast
from pathlib import Path

import minisgl

PKG = Path(minisgl.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _runtime_imports(source: str) -> set[str]:
    """The minisgl modules a source imports when it runs: at module level or inside a function,
    but not under ``if TYPE_CHECKING:``. ``from minisgl.x import y`` counts y when y is a module."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    mods = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minisgl"):
            if node.module != "minisgl":  # the package root is a namespace, not a layer
                mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names if a.name.startswith("minisgl."))
    return {m for m in mods if m in MODULES}


GRAPH = {name: _runtime_imports(path.read_text()) for name, path in MODULES.items()}


def _reachable(module: str, graph: dict[str, set[str]]) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen, stack = set(), [module]
    while stack:
        for dep in graph.get(stack.pop(), ()):
            if dep not in seen and dep != module:
                seen.add(dep)
                stack.append(dep)
    return seen


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


# What each package may never reach, however indirectly. Upward references are allowed only
# under TYPE_CHECKING (annotations). minisgl's rule is stricter than SGLang's, whose layers/
# import model_executor and whose models/ import managers (see the models-and-layers chapter).
FORBIDDEN = {
    "layers": {"models", "managers", "model_executor", "speculative", "entrypoints"},
    "mem_cache": {"layers", "models", "managers", "model_executor", "speculative", "entrypoints"},
    "sampling": {"layers", "models", "managers", "model_executor", "speculative", "entrypoints"},
    "models": {"managers", "model_executor", "speculative", "entrypoints"},
    "model_executor": {"managers", "speculative", "entrypoints"},
    "configs": {"model_loader", "models", "layers", "model_executor", "managers", "entrypoints"},
    "speculative": {"entrypoints"},
    "managers": {"entrypoints"},
}


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module in sorted(graph):
        forbidden = FORBIDDEN.get(_layer(module), set())
        for dep in sorted(_reachable(module, graph)):
            if _layer(dep) in forbidden:
                bad.append(f"{module} reaches {dep}")
    return bad


def test_c10_no_package_reaches_a_layer_above_it():
    violations = layering_violations(GRAPH)
    assert not violations, "\n".join(violations[:20])


def test_c10_the_check_follows_imports_through_other_modules():
    """A runtime import layers -> speculative, even two hops away, fails the check."""
    graph = {m: set(deps) for m, deps in GRAPH.items()}
    graph["minisgl.layers.linear"].add("minisgl.layers.sampler")
    graph["minisgl.layers.sampler"].add("minisgl.speculative.spec_info")
    violations = layering_violations(graph)
    assert "minisgl.layers.linear reaches minisgl.speculative.spec_info" in violations, violations[:5]
    # And the same import under TYPE_CHECKING is an annotation, not a dependency.
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from minisgl.speculative import spec_info\n"
    assert _runtime_imports(source) == set()


def test_c1_scheduler_reaches_only_the_worker():
    path = PKG / "managers" / "scheduler.py"
    imports = GRAPH["minisgl.managers.scheduler"]
    assert not [m for m in imports if m.startswith(("minisgl.model_executor", "minisgl.models"))], imports
    attrs = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    assert "model_runner" not in attrs and "model" not in attrs


def test_c1_scheduler_holds_a_tp_model_worker(tiny_llama):
    from minisgl.entrypoints.engine import Engine
    from minisgl.managers.tp_worker import TpModelWorker

    engine = Engine(model_path=tiny_llama, max_total_tokens=64)
    assert type(engine.scheduler.tp_worker) is TpModelWorker
    assert not any("ModelRunner" in type(v).__name__ for v in vars(engine.scheduler).values())
