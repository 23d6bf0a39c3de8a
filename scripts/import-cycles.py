#!/usr/bin/env python3
"""Lists the file-level import circles of each crate of the workspace.

A file (module) A depends on B when A names B through `crate::b`, `super::b`,
`use super::{b, ..}`, or, for B a child of A, `b::` (the crate root's `mod`
lines alone are no dependency).
Circles are the strongly connected components with more than one file.
Prints one line per circle and exits 1 when there is any (0 otherwise), so
it can gate CI once the circles are gone.

    scripts/import-cycles.py [CRATE_DIR ...]   (default: every workspace member)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def members():
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return [ROOT / s for s in re.findall(r'"([^"]+)"', m.group(1))]


def module_of(src: Path, f: Path) -> str:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts) or "crate"


def strip(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    # Test modules are not part of the room structure.
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests", text)
    return text[: cut.start()] if cut else text


def deps(mod: str, text: str, modules: set) -> set:
    out = set()
    parent = mod.rsplit("::", 1)[0] if "::" in mod else "crate"
    refs = re.findall(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text)
    for r in refs:
        out.add(r)
    for group in re.findall(r"\bsuper::\{([^}]*)\}", text):
        for name in re.findall(r"\b([a-z_][a-z0-9_]*)\b", group):
            out.add(name if parent == "crate" else f"{parent}::{name}")
    for name in re.findall(r"\bsuper::([a-z_][a-z0-9_]*)", text):
        out.add(name if parent == "crate" else f"{parent}::{name}")
    # A module naming its own child (`spec::read` in snapshot/mod.rs).
    prefix = "" if mod == "crate" else mod + "::"
    for m in modules:
        if m.startswith(prefix) and "::" not in m[len(prefix):] and m != mod:
            child = m[len(prefix):]
            if re.search(r"(?<![:\w])" + re.escape(child) + r"::", text):
                out.add(m)
    found = set()
    for r in out:
        parts = r.split("::")
        # The longest prefix that is a module of this crate.
        for n in range(len(parts), 0, -1):
            cand = "::".join(parts[:n])
            if cand in modules:
                if cand != mod:
                    found.add(cand)
                break
    return found


def circles(crate: Path):
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    mods = {module_of(src, f): f for f in files}
    graph = {m: deps(m, strip(f.read_text()), set(mods)) for m, f in mods.items()}
    # The crate root declares every module: that alone is no dependency.
    graph["crate"] = set()
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    crates = [Path(a).resolve() for a in sys.argv[1:]] or members()
    found = 0
    for crate in crates:
        for comp in circles(crate):
            found += 1
            print(f"{crate.name}: {' <-> '.join(comp)}")
    if not found:
        print("no file-level import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
