"""Rewrite the Test column of every claims table in docs/ from the files in tests/.

A claims table has the header `| Claim | ... | Test |` (see docs/contributing.md). For
claim C<N>, the tests are the files tests/**/test_*.py whose name contains `c<N>_` as a
token (test_c5_init_order.py, test_c4_c5_model_runner_init.py). When some exist, the cell
lists them; when none does, the cell reads `planned — <expected name>`, keeping the
expected name it had.

    python scripts/sync_claims.py          # rewrite in place, print what changed
    python scripts/sync_claims.py --check  # exit 1 if anything would change
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
_SPAN = re.compile(r"`([^`]+)`")


def claim_tests(n: int) -> list[str]:
    pattern = re.compile(rf"(?:^test_|_)c{n}_")
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py") if pattern.search(p.name))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def sync_page(text: str) -> str:
    lines = text.splitlines(keepends=True)
    in_claims = False
    fence = None
    for i, line in enumerate(lines):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = m.group(1) if fence is None else None  # examples in code blocks stay as written
            continue
        if fence is not None or not line.lstrip().startswith("|"):
            in_claims = False
            continue
        cells = _cells(line)
        if cells[0] == "Claim" and cells[-1] == "Test":
            in_claims = True
            continue
        m = re.fullmatch(r"\**C(\d{1,2})\**", cells[0])
        if not in_claims or not m:
            continue
        n = int(m.group(1))
        present = claim_tests(n)
        old_cell = cells[-1]
        if present:
            new_cell = ", ".join(f"`{t}`" for t in present)
        else:
            named = _SPAN.findall(old_cell)
            expected = named[0] if named else f"tests/test_c{n}_<topic>.py"
            new_cell = f"planned — `{expected}`"
        if new_cell != old_cell:
            head, _, _ = line.rstrip("\n").rstrip().rstrip("|").rpartition("|")
            lines[i] = f"{head}| {new_cell} |\n"
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, do not write")
    args = parser.parse_args()
    changed = []
    for page in sorted(DOCS.rglob("*.md")):
        old = page.read_text(encoding="utf-8")
        new = sync_page(old)
        if new != old:
            changed.append(page.relative_to(REPO).as_posix())
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for name in changed:
        print(("would update " if args.check else "updated ") + name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
