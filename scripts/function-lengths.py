#!/usr/bin/env python3
"""Lists the workspace's production functions longer than a limit.

Production code is every `.rs` file under each workspace member's `src/`
(the e2e crate's harness library included), read whole. Left out as test
code: an inline `#[cfg(test)] mod x { ... }` block (to its closing brace;
what follows it is read again) and a file a parent declares as
`#[cfg(test)] mod x;` (with the files under it). A declaration like that
is one item: reading goes on after it.

A function is counted from its `fn` line to its closing brace (doc comments
and attributes above it are not counted; a function nested in another counts
within it). Comments, string and character literals are blanked before
braces are matched, so a `"{"` or a `'}'` does not move the count. Prints
one line per function over the limit (lines, file:line, name) and exits 1
when there is any, so it can gate CI; `--top N` lists the N longest instead,
whatever their length.

    scripts/function-lengths.py [--limit 80] [--top N]
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
# `#[cfg(test)]`, other attributes after it, then `mod name` and either `;`
# (a file elsewhere) or `{` (a block here).
TEST_MOD = re.compile(
    r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])"
)


def members():
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return re.findall(r'"([^"]+)"', m.group(1))


def blank(text: str) -> str:
    """`text` with comments and string and character literals replaced by
    spaces, newlines kept, so that lines and offsets still match the file."""
    out = list(text)
    n, i = len(text), 0

    def erase(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            erase(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            erase(i, j)
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            erase(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            erase(i, j + 1)
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'").match(text, i)
            if m:
                erase(i, m.end())
                i = m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def closing(code: str, open_at: int) -> int:
    """The offset just past the brace that closes the one at `open_at`."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(code)


def production(code: str):
    """`code` with its inline test modules blanked, and the names of the
    test modules it declares in files of their own."""
    out, at, declared = [], 0, []
    for m in TEST_MOD.finditer(code):
        if m.start() < at:
            continue
        if m.group(5) == ";":
            declared.append(m.group(4))
            continue
        end = closing(code, m.end() - 1)
        out.append(code[at : m.start()])
        out.append(re.sub(r"[^\n]", " ", code[m.start() : end]))
        at = end
    out.append(code[at:])
    return "".join(out), declared


def child_files(path: Path, name: str):
    """Where the module `name` declared in `path` lives: its file, or its
    folder."""
    own = path.stem in ("mod", "lib", "main")
    base = path.parent if own else path.parent / path.stem
    return [base / f"{name}.rs", base / name]


def functions(path: Path, lines):
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            for ch in lines[j]:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                break
            if not opened and lines[j].rstrip().endswith(";"):
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
        files = sorted((ROOT / member / "src").rglob("*.rs"))
        tests = set()
        code = {}
        for f in files:
            code[f], declared = production(blank(f.read_text()))
            for name in declared:
                tests.update(child_files(f, name))
        for f in files:
            if any(t == f or t in f.parents for t in tests):
                continue
            found.extend(functions(f, code[f].split("\n")))
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
