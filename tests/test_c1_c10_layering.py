"""C1: the Scheduler drives a TpModelWorker, never a ModelRunner or a model.
C10: no package reaches a layer above it through runtime imports, however indirectly: layers/
never reach models/, managers/, model_executor/ or speculative/; models/ never reach the
execution shell; every package has a rule. Checked on the transitive import graph. Imports
under `if TYPE_CHECKING:` are annotations, not dependencies, and are skipped (those under
`if not TYPE_CHECKING:` or its else branch are not); `from minisgl import X` counts the module
the package root's lazy ``__getattr__`` imports X from; importlib.import_module and
__import__ count their target. Each hole has a self-test that injects it and sees the check
fail. Also here: no minisgl .py file is over 400 lines."""

import ast
from pathlib import Path

import pytest

import minisgl

PKG = Path(minisgl.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, (ast.Name, ast.Attribute)) and ast.unparse(test).endswith("TYPE_CHECKING")


def _annotation_only(tree: ast.AST) -> set[int]:
    """The nodes that run only under type checking: the body of ``if TYPE_CHECKING:`` and the
    else branch of ``if not TYPE_CHECKING:``."""
    skip = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        if _is_type_checking(node.test):
            branch = node.body
        elif isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            branch = node.orelse if _is_type_checking(node.test.operand) else []
        else:
            branch = []
        skip.update(id(n) for stmt in branch for n in ast.walk(stmt))
    return skip


def _root_exports() -> dict[str, str]:
    """Names the package root hands out lazily (``minisgl.Engine``) -> the module they come from."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    return {a.asname or a.name: n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def _dynamic_targets(call: ast.Call) -> set[str]:
    """The modules importlib.import_module / __import__ load: a literal name, or every module
    under a literal prefix (f"minisgl.models.{name}"); any other argument could be anything."""
    name = ast.unparse(call.func)
    if not (name.endswith("import_module") or name == "__import__") or not call.args:
        return set()
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value} if arg.value.startswith("minisgl") else set()
    prefix = ""
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
    if prefix and not prefix.startswith("minisgl"):
        return set()
    return {m for m in MODULES if m.startswith(prefix)} if prefix.startswith("minisgl.") else set(MODULES)


def _runtime_imports(source: str) -> set[str]:
    """The minisgl modules a source imports when it runs: at module level or inside a function,
    but not under ``if TYPE_CHECKING:``. ``from minisgl.x import y`` counts y when y is a module."""
    tree = ast.parse(source)
    skip = _annotation_only(tree)
    exports = _root_exports()
    mods = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minisgl"):
            if node.module == "minisgl":  # the root: a submodule, a name its __getattr__ imports, or a constant
                mods.update(exports.get(a.name, f"minisgl.{a.name}") for a in node.names)
            else:
                mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names if a.name.startswith("minisgl."))
        elif isinstance(node, ast.Call):
            mods.update(_dynamic_targets(node))
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
_SHELL = {"managers", "model_executor", "speculative", "entrypoints", "tools"}
FORBIDDEN = {
    "kernels": {"layers", "models", "mem_cache", "sampling", "configs", "model_loader", "constrained", "distributed",
                "eplb"} | _SHELL,
    "distributed": {"layers", "models", "mem_cache", "sampling", "model_loader", "constrained", "eplb"} | _SHELL,
    "eplb": {"layers", "models", "mem_cache", "sampling", "model_loader", "constrained"} | _SHELL,
    "configs": {"model_loader", "models", "layers", "mem_cache", "sampling", "constrained"} | _SHELL,
    "mem_cache": {"layers", "models", "sampling", "model_loader", "constrained"} | _SHELL,
    "constrained": {"layers", "models", "model_loader"} | _SHELL,
    "sampling": {"layers", "models", "mem_cache", "model_loader"} | _SHELL,
    "layers": {"models", "model_loader"} | _SHELL,
    "models": _SHELL,
    "model_loader": _SHELL,
    "model_executor": _SHELL - {"model_executor"},
    "speculative": {"entrypoints", "tools"},
    "managers": {"entrypoints", "tools"},
    "entrypoints": {"tools"},
    # Tool-call parsers read model text and nothing of the runtime (SGLang's srt/function_call/ too).
    "function_call": {"kernels", "distributed", "eplb", "configs", "mem_cache", "constrained", "sampling", "layers",
                      "models", "model_loader"} | _SHELL,
    "tools": set(),  # the scripts that draw figures and refresh traces may use anything; nothing uses them
}  # fmt: skip


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


def _violations_with(module: str, source: str) -> list[str]:
    """The layering check with ``source`` appended to ``module``: a hole injected into the real graph."""
    graph = {m: set(deps) for m, deps in GRAPH.items()}
    graph[module] |= _runtime_imports(MODULES[module].read_text() + "\n" + source)
    return layering_violations(graph)


HOLES = {
    "the root's lazy Engine": "from minisgl import Engine\n",
    "if not TYPE_CHECKING": "if not TYPE_CHECKING:\n    import minisgl.managers.scheduler\n",
    "else of if TYPE_CHECKING": "if TYPE_CHECKING:\n    pass\nelse:\n    import minisgl.managers.scheduler\n",
    "importlib": "import importlib\nimportlib.import_module('minisgl.managers.scheduler')\n",
    "importlib with a prefix": "import importlib\nimportlib.import_module(f'minisgl.managers.{NAME}')\n",
    "__import__": "__import__('minisgl.entrypoints.engine')\n",
}  # fmt: skip


@pytest.mark.parametrize("hole", sorted(HOLES))
def test_c10_self_test_each_hole_fails_the_check(hole):
    """Each way an upward import once slipped through, injected into layers/linear.py, fails."""
    assert _violations_with("minisgl.layers.linear", "") == []
    violations = _violations_with("minisgl.layers.linear", HOLES[hole])
    assert any(v.startswith("minisgl.layers.linear reaches minisgl.") for v in violations), hole


def test_c10_self_test_constrained_may_not_reach_managers():
    """A package that had no rule (constrained/) now has one: an import up to managers/ fails."""
    assert _violations_with("minisgl.constrained.grammar_manager", "from minisgl.managers.schedule_batch import Req\n")


def test_c10_every_package_has_a_rule():
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(FORBIDDEN), packages ^ set(FORBIDDEN)


def test_no_minisgl_file_is_over_400_lines():
    """The style rule (small files with one job), as a test a reader can rerun."""
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


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
