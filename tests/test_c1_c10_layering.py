"""C1: the Scheduler drives a TpModelWorker, never a ModelRunner or a model.
C10: models/ import only layers/ (+ configs, loader utils, distributed); layers/ never import
models/, managers/ or model_executor/. Checked on the import graph (imports under
`if TYPE_CHECKING:` are annotations, not dependencies, and are skipped)."""

import ast
from pathlib import Path

import minisgl

PKG = Path(minisgl.__file__).parent


def _runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    mods = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return {m for m in mods if m.startswith("minisgl")}


def _files(subpackage: str):
    return sorted((PKG / subpackage).rglob("*.py"))


def test_c10_layers_import_nothing_above():
    forbidden = ("minisgl.models", "minisgl.managers", "minisgl.model_executor", "minisgl.entrypoints")
    for path in _files("layers"):
        bad = [m for m in _runtime_imports(path) if m.startswith(forbidden)]
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_c10_models_import_only_bricks():
    allowed = ("minisgl.layers", "minisgl.models", "minisgl.model_loader.weight_utils", "minisgl.distributed", "minisgl.configs")
    for path in _files("models"):
        bad = [m for m in _runtime_imports(path) if not m.startswith(allowed)]
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_c10_model_executor_never_imports_managers():
    for path in _files("model_executor"):
        bad = [m for m in _runtime_imports(path) if m.startswith(("minisgl.managers", "minisgl.entrypoints"))]
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_c1_scheduler_reaches_only_the_worker():
    path = PKG / "managers" / "scheduler.py"
    imports = _runtime_imports(path)
    assert not [m for m in imports if m.startswith(("minisgl.model_executor", "minisgl.models"))], imports
    attrs = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    assert "model_runner" not in attrs and "model" not in attrs


def test_c1_scheduler_holds_a_tp_model_worker(tiny_llama):
    from minisgl.entrypoints.engine import Engine
    from minisgl.managers.tp_worker import TpModelWorker

    engine = Engine(model_path=tiny_llama, max_total_tokens=64)
    assert type(engine.scheduler.tp_worker) is TpModelWorker
    assert not any("ModelRunner" in type(v).__name__ for v in vars(engine.scheduler).values())
