#!/usr/bin/env python3
"""Lists the import circles of each crate of the workspace: file-level ones
(the gate) and folder-level ones (the gate too).

A file (module) A depends on B when A names B through a `crate::`, `super::`
(any number of them) or `self::` path, use trees included
(`use crate::{b::X, c}` names b and c), or, for B a child of A, `b::` (the
crate root's `mod` lines alone are no dependency). Files are read whole:
comments and string literals are blanked, inline `#[cfg(test)] mod x { .. }`
blocks are left out and reading goes on after them, and a file declared as
`#[cfg(test)] mod x;` (with the files under it) is test code, no module of
the graph (the same reading as function-lengths.py).

File-level circles are the strongly connected components with more than
one file. KNOWN lists the circles this reading found when it began to read
`super::Item` and use trees (the reading before it saw only lowercase
names): each is printed as known while it stays within its entry, and
fails the gate once it takes in another file. Folder-level circles are found folder by folder: the entries of a
folder (its files, and its sub-folders each taken as one node) with an edge
where anything under one names anything under another; a component that
holds a folder is printed under its own heading. Exits 1 when there is any
file-level circle outside KNOWN or any folder-level circle (0 otherwise), so
it gates CI.

    scripts/import-cycles.py [CRATE_DIR ...]   (default: every workspace member)
    scripts/import-cycles.py --self-test       (checks the reading on a temporary crate)
"""

import importlib.util
import re
import sys
import tempfile
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


def _function_lengths():
    """function-lengths.py, for its reading of Rust (blanking, test modules)."""
    spec = importlib.util.spec_from_file_location(
        "function_lengths", Path(__file__).resolve().parent / "function-lengths.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FL = _function_lengths()

# Circles through a folder's mod.rs that predate this reading, by crate: a
# child names an item of mod.rs (`super::CONTROL_MOUNT`, `super::InitStart`)
# while mod.rs names the child. Their files are being split (snapshot/,
# lifecycle/); remove an entry with its circle.
KNOWN = {
    "artifact": [
        {"content", "content::check", "content::files", "content::hash", "content::stream"},
    ],
}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def use_paths(text: str, at: int):
    """The paths of the path or use tree starting at `at` (`a::b::{c, d::e}`
    gives a::b::c and a::b::d::e); `*` and `self` name the prefix."""

    def skip(i):
        while i < len(text) and text[i].isspace():
            i += 1
        return i

    def tree(i, prefix):
        i = skip(i)
        if text.startswith("{", i):
            out, i = [], i + 1
            while True:
                i = skip(i)
                if i >= len(text) or text[i] == "}":
                    return out, i + 1
                paths, i = tree(i, prefix)
                out += paths
                i = skip(i)
                if i < len(text) and text[i] == ",":
                    i += 1
        if text.startswith("*", i):
            return [prefix], i + 1
        m = IDENT.match(text, i)
        if not m:
            return [prefix], i
        name = m.group(0)
        path = prefix if name == "self" else prefix + [name]
        j = skip(m.end())
        if text.startswith("::", j):
            return tree(j + 2, path)
        alias = re.compile(r"as\s+[A-Za-z_][A-Za-z0-9_]*").match(text, j)
        return [path], alias.end() if alias else m.end()

    return tree(at, [])[0]


def deps(mod: str, text: str, modules: set) -> set:
    out = set()
    here = [] if mod == "crate" else mod.split("::")
    # Each path that starts at `crate`, `self` or `super` (not one that is
    # the tail of another path, `a::super::b` is no Rust anyway).
    for m in re.finditer(r"(?<![\w:])(crate|self|super)\s*::", text):
        for path in use_paths(text, m.start()):
            if not path:
                continue
            if path[0] == "crate":
                full = path[1:]
            else:
                base = list(here)
                k = 0
                if path[0] == "self":
                    k = 1
                while k < len(path) and path[k] == "super":
                    base, k = base[:-1], k + 1
                full = base + path[k:]
            out.add("::".join(full) or "crate")
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


def graph_of(crate: Path):
    """The crate's modules and what each names (test modules left out)."""
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    code, tests = {}, set()
    for f in files:
        code[f], declared = FL.production(FL.blank(f.read_text()))
        for name in declared:
            tests.update(FL.child_files(f, name))
    files = [f for f in files if not any(t == f or t in f.parents for t in tests)]
    mods = {module_of(src, f): f for f in files}
    graph = {m: deps(m, code[f], set(mods)) for m, f in mods.items()}
    # The crate root declares every module: that alone is no dependency.
    graph["crate"] = set()
    return graph


def components(graph):
    """The strongly connected components with more than one node (Tarjan)."""
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
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def folder_circles(graph):
    """Per folder, the circles among its entries that hold a sub-folder,
    each entry written as a path (`lifecycle/`, `task.rs`)."""
    modules = [m for m in graph if m != "crate"]
    folders = {"crate"} | {m for m in modules if any(o.startswith(m + "::") for o in modules)}
    out = []
    for folder in sorted(folders):
        prefix = "" if folder == "crate" else folder + "::"

        def entry(m):
            if m == folder or not m.startswith(prefix):
                return None
            return prefix + m[len(prefix):].split("::")[0]

        level = {}
        for m, targets in graph.items():
            a = entry(m)
            if a is None:
                continue
            level.setdefault(a, set())
            for t in targets:
                b = entry(t)
                if b is not None and b != a:
                    level[a].add(b)
        for comp in components(level):
            if any(c in folders for c in comp):
                out.append(
                    [c.replace("::", "/") + ("/" if c in folders else ".rs") for c in comp]
                )
    return out


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    crates = [Path(a).resolve() for a in argv] or members()
    found, known, folders = 0, [], []
    for crate in crates:
        graph = graph_of(crate)
        for comp in components(graph):
            if any(set(comp) <= k for k in KNOWN.get(crate.name, [])):
                known.append((crate.name, comp))
                continue
            found += 1
            print(f"{crate.name}: {' <-> '.join(comp)}")
        folders += [(crate.name, comp) for comp in folder_circles(graph)]
    if not found:
        print("no file-level import circles" + (" but the known ones" if known else ""))
    if known:
        print("\nknown file-level import circles (KNOWN, to be removed):")
        for name, comp in known:
            print(f"{name}: {' <-> '.join(comp)}")
    if folders:
        print("\nfolder-level import circles:")
        for name, comp in folders:
            print(f"{name}: {' <-> '.join(comp)}")
    else:
        print("no folder-level import circles")
    return 1 if found or folders else 0


def self_test():
    """Reads a temporary crate whose circles are known."""
    files = {
        "main.rs": "mod a;\nmod b;\nmod c;\nmod x;\n",
        # A file-level circle through a use tree (renamed), past a string
        # and a comment that name c.
        "a.rs": 'const S: &str = "crate::c::f"; // crate::c\nuse crate::{b::g, b as _};\n',
        "b.rs": "pub fn g() { crate::a::h() }\n",
        # Named only from an inline test module: no edge from c to x.
        "c.rs": "#[cfg(test)]\nmod tests {\n    use crate::x;\n}\n",
        # What follows a test module declared as a file is read (x names
        # c); the test file is no module; y reaches b through super::super.
        "x/mod.rs": "#[cfg(test)]\nmod tests;\nmod y;\nuse crate::c::f;\n",
        "x/tests.rs": "use crate::a;\n",
        "x/y.rs": "pub fn y() { super::super::b::g() }\n",
    }
    # c names y, under x/: the folder x/ and c.rs are a folder-level circle
    # with no file-level one (x -> c -> x::y).
    files["c.rs"] += "pub fn back() { crate::x::y::y() }\n"
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            path = Path(tmp) / "src" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        graph = graph_of(Path(tmp))
        want = {
            "crate": set(),
            "a": {"b"},
            "b": {"a"},
            "c": {"x::y"},
            "x": {"c"},
            "x::y": {"b"},
        }
        assert graph == want, graph
        assert components(graph) == [["a", "b"]], components(graph)
        assert folder_circles(graph) == [["c.rs", "x/"]], folder_circles(graph)
    print("self-test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
