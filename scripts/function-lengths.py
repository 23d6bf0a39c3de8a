#!/usr/bin/env python3
"""Lists the workspace's production functions longer than a limit.

A function is counted from its `fn` line to its closing brace (doc comments
and attributes above it are not counted); test modules (`#[cfg(test)] mod`)
and the tests/ crate are left out. Prints one line per function over the
limit (lines, file:line, name) and exits 1 when there is any, so it can gate
CI; `--top N` lists the N longest instead, whatever their length.

    scripts/function-lengths.py [--limit 80] [--top N]
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def members():
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return [s for s in re.findall(r'"([^"]+)"', m.group(1)) if s != "tests"]


def production(text: str) -> str:
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+", text)
    return text[: cut.start()] if cut else text


def functions(path: Path):
    lines = production(path.read_text()).split("\n")
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            # Comments and character literals (b'{') hold no braces.
            code = re.sub(r"b?'(\\.|[^\\'])'", "''", re.sub(r"//.*", "", lines[j]))
            for ch in code:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                break
            if not opened and code.rstrip().endswith(";"):
                break
            j += 1
        if opened:
            yield j - i + 1, f"{path.relative_to(ROOT)}:{i + 1}", m.group(6)
            i = j + 1
        else:
            i += 1


def main(argv):
    limit, top = 80, None
    if "--limit" in argv:
        limit = int(argv[argv.index("--limit") + 1])
    if "--top" in argv:
        top = int(argv[argv.index("--top") + 1])
    found = []
    for member in members():
        for f in sorted((ROOT / member / "src").rglob("*.rs")):
            found.extend(functions(f))
    found.sort(reverse=True)
    if top is not None:
        for n, where, name in found[:top]:
            print(f"{n:5} {where} {name}")
        return 0
    over = [f for f in found if f[0] > limit]
    for n, where, name in over:
        print(f"{n:5} {where} {name}")
    if not over:
        print(f"no production function over {limit} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
