"""How the docs tests read minisgl's source (test_docs.py): parsed with ast, never imported, so
a reference in the docs resolves or not without running any of the code it names."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from tests.docs_markdown import REPO

PKG = REPO / "minisgl"


@dataclass
class ClassInfo:
    members: set[str]
    bases: list[str]


@dataclass
class ModuleInfo:
    defined: set[str]  # top-level classes, functions, assignments
    imported: set[str]  # names brought in by import statements
    classes: dict[str, ClassInfo]


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            out.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        return out
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _class_info(node: ast.ClassDef) -> ClassInfo:
    members: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(item.name)
        for t in _targets(item):
            if isinstance(t, ast.Name):
                members.add(t.id)
    # Instance attributes: self.x = ... anywhere in the class's methods.
    for sub in ast.walk(node):
        for t in _targets(sub):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                members.add(t.attr)
    bases = []
    for b in node.bases:
        if isinstance(b, ast.Name):
            bases.append(b.id)
        elif isinstance(b, ast.Attribute):
            bases.append(b.attr)
    return ClassInfo(members, bases)


@functools.lru_cache(maxsize=None)
def module_info(rel: str) -> ModuleInfo:
    tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
    defined, imported, classes = set(), set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.ClassDef):
            defined.add(node.name)
            classes[node.name] = _class_info(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        for t in _targets(node):
            if isinstance(t, ast.Name):
                defined.add(t.id)
    return ModuleInfo(defined, imported, classes)


@functools.lru_cache(maxsize=None)
def all_classes() -> dict[str, list[ClassInfo]]:
    out: dict[str, list[ClassInfo]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for name, info in module_info(path.relative_to(REPO).as_posix()).classes.items():
            out.setdefault(name, []).append(info)
    return out


def class_has(cls: str, member: str, _seen: frozenset = frozenset()) -> bool:
    for info in all_classes().get(cls, []):
        if member in info.members:
            return True
        for base in info.bases:
            if base not in _seen and class_has(base, member, _seen | {cls}):
                return True
    return False


def module_file(dotted: str) -> str | None:
    """'minisgl.a.b' -> 'minisgl/a/b.py' or 'minisgl/a/b/__init__.py', if it exists."""
    base = dotted.replace(".", "/")
    for cand in (f"{base}.py", f"{base}/__init__.py"):
        if (REPO / cand).is_file():
            return cand
    return None


def resolve_symbol(rel: str, symbol: str) -> str | None:
    """None if `symbol` ('f', 'Class', 'Class.member') is defined in file `rel`, else why not."""
    info = module_info(rel)
    head, _, rest = symbol.partition(".")
    if head not in info.defined:
        return f"{rel} defines no {head!r}"
    if not rest:
        return None
    if head not in info.classes:
        return f"{head!r} in {rel} is not a class, so it has no {rest!r}"
    if "." in rest:
        return f"only Class.member is supported, not {symbol!r}"
    cls = info.classes[head]
    if rest in cls.members or any(class_has(b, rest) for b in cls.bases):
        return None
    return f"class {head} in {rel} has no member {rest!r}"
