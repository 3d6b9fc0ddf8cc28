#!/usr/bin/env python3
"""The house rules of crates/*/src, checked: no file over 600 lines, no import circle among
the modules of the library, and no import from a lower floor of the layer picture
(../shared/DESIGN.md) to a higher one.

A circle is counted among siblings: under each module, its child modules A and B are in a
circle when something in A uses something in B and something in B, through any chain of
siblings, uses something in A (a circle means two rooms share a concept that belongs in a
third). A module's use of its parent or of its own children is not a circle.

    python3 integration/house.py          # prints what breaks a rule, exits 1 if anything does
    python3 integration/house.py --graph  # also prints the library's top-level imports
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "crates" / "stoker" / "src"
MAX_LINES = 600

# The layer picture, lowest floor first: a module may use its own floor and those below.
# Text and range leaves at the bottom, then the one error type, then I/O (fetch < cache <
# store) under the layouts (source), which decoding and the loader build on; the tools
# (pack, diagnose) and the test entry points (conformance, fuzzing) sit on top.
FLOORS = [
    {"redact", "escape", "ranges", "fork", "npy", "small_file", "prefetch", "memory"},
    {"buffer"},
    {"error"},
    {"sample", "uri", "stats"},
    {"fetch"},
    {"cache"},
    {"store"},
    {"batch", "pinned", "sampler"},
    {"source"},
    {"decode"},
    {"loader", "tokens"},
    {"pack", "diagnose", "demo", "docs", "conformance", "fuzzing"},
]

USE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*;')


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_tree():
    """Every module of the library: path tuple -> its file."""
    mods = {(): LIB / "lib.rs"}
    todo = [()]
    while todo:
        m = todo.pop()
        f = mods[m]
        text = strip_comments(f.read_text())
        here = f.parent if f.name in ("lib.rs", "mod.rs") else f.parent / f.stem
        explicit = {name: f.parent / p for p, name in PATH_ATTR.findall(text)}
        for name in MOD.findall(text):
            if name in explicit:
                child = explicit[name]
            elif (here / name / "mod.rs").exists():
                child = here / name / "mod.rs"
            else:
                child = here / f"{name}.rs"
            if child.exists() and (m + (name,)) not in mods:
                mods[m + (name,)] = child
                todo.append(m + (name,))
    return mods


def uses(mods):
    """Module -> the modules it names (resolved to the longest known module path)."""
    out = {}
    for m, f in mods.items():
        text = strip_comments(f.read_text())
        # Group imports `use crate::{a::X, b::Y}` name several paths.
        text = expand_groups(text)
        found = set()
        for base, rest in USE.findall(text):
            parts = tuple(rest.strip(":").split("::"))
            full = resolve_supers(m, base, parts)
            while full and full not in mods:
                full = full[:-1]
            if full:
                found.add(full)
        out[m] = found
    return out


def resolve_supers(m, base, parts):
    if base == "crate":
        return parts
    here = m
    if base == "super":
        here = here[:-1]
    parts = list(parts)
    while parts and parts[0] == "super":
        here = here[:-1]
        parts.pop(0)
    return tuple(here) + tuple(parts)


def expand_groups(text):
    """`crate::a::{b::C, d}` -> `crate::a::b::C crate::a::d` (one level of braces)."""
    pat = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_]\w*)*)::\{([^{}]*)\}")
    while True:
        new = pat.sub(lambda mt: " ".join(f"{mt.group(1)}::{p.strip()}" for p in mt.group(2).split(",") if p.strip() and p.strip() != "self"), text)
        if new == text:
            return text
        text = new


def circles(mods, used):
    """Sibling circles: for each parent, strongly connected groups of its children."""
    found = []
    parents = {m[:-1] for m in mods if m}
    for p in sorted(parents):
        kids = sorted(m for m in mods if m[:-1] == p and m)
        edges = {k: set() for k in kids}
        for m, targets in used.items():
            if m[: len(p) + 1] not in edges:
                continue
            src = m[: len(p) + 1]
            for t in targets:
                dst = t[: len(p) + 1]
                if len(t) > len(p) and t[: len(p)] == p and dst in edges and dst != src:
                    edges[src].add(dst)
        for group in scc(edges):
            if len(group) > 1:
                found.append((p, sorted(group)))
    return found


def scc(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            out.append(group)

    for v in edges:
        if v not in index:
            visit(v)
    return out


def floor_of(top):
    for i, f in enumerate(FLOORS):
        if top in f:
            return i
    return None


def main():
    problems = []
    for f in sorted((ROOT / "crates").glob("*/src/**/*.rs")):
        n = sum(1 for _ in f.open())
        if n > MAX_LINES:
            problems.append(f"{f.relative_to(ROOT)}: {n} lines (at most {MAX_LINES}: split it by concern)")
    mods = module_tree()
    used = uses(mods)
    for parent, group in circles(mods, used):
        where = "::".join(("crate",) + parent)
        names = ", ".join(g[-1] for g in group)
        problems.append(f"import circle under {where}: {names}")
    top_edges = set()
    for m, targets in used.items():
        for t in targets:
            if m and t and m[0] != t[0]:
                top_edges.add((m[0], t[0]))
    for a, b in sorted(top_edges):
        fa, fb = floor_of(a), floor_of(b)
        if fa is None or fb is None:
            problems.append(f"module {a if fa is None else b} has no floor in integration/house.py's FLOORS")
        elif fb > fa:
            problems.append(f"{a} (floor {fa}) imports {b} (floor {fb}), a higher floor")
    if "--graph" in sys.argv:
        for a, b in sorted(top_edges):
            print(f"{a} -> {b}")
    for p in sorted(set(problems)):
        print(p)
    if problems:
        sys.exit(1)
    print(f"house: ok ({len(mods)} modules, no file over {MAX_LINES} lines, no circle, floors kept)")


if __name__ == "__main__":
    main()
