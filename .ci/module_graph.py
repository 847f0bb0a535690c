#!/usr/bin/env python3
"""Checks that the graph of source files of every crate is acyclic, and so is the graph of its
top-level modules (each folder or file under src/ taken as one node, the crate root left out):
files can form no cycle while their modules do (a/x.rs -> b.rs -> a/y.rs).

An edge A -> B means file A names an item of file B: a `crate::…`, `super::…` or `self::…` path,
or a path through a child module that A declares (`mod x;` makes `x::…` in A an edge to x's file).
A path resolves to the deepest module file it reaches (`crate::config::runtime::X` is
config/runtime.rs, `crate::config::Config` is config/mod.rs). Comment lines are ignored, so doc
links do not count. `mod x;` itself is not an edge: the module tree is not a use.

Run from the repository root: python3 .ci/module_graph.py [--print]. Exit 1 on a cycle.
"""
import os
import re
import sys

SEGMENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_files(src):
    """Maps each module path (tuple of names; () is the crate root) to its file."""
    files = {}
    for directory, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(directory, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts == [] and name == "main.rs" and os.path.exists(os.path.join(src, "lib.rs")):
                continue  # the binary root is a separate crate that uses the library
            files[tuple(parts)] = os.path.join(directory, name)
    return files


def code_lines(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            stripped = line.strip()
            if stripped.startswith("//"):
                continue
            yield line.split("//")[0] if '"' not in line else line


def expand_groups(text):
    """`a::{b, c::d}` becomes `a::b a::c::d` (one level of braces is enough here)."""
    def repl(match):
        prefix, inner = match.group(1), match.group(2)
        items = [item.strip() for item in inner.split(",") if item.strip()]
        return " ".join(f"{prefix}::{item}" for item in items)

    previous = None
    while previous != text:
        previous = text
        text = re.sub(rf"((?:{SEGMENT}::)*{SEGMENT})::\{{([^{{}}]*)\}}", repl, text)
    return text


def resolve(files, base, segments):
    """The deepest existing module reached from `base` by `segments`."""
    current = tuple(base)
    for segment in segments:
        if segment == "super":
            current = current[:-1]
        elif segment == "self":
            continue
        elif current + (segment,) in files:
            current = current + (segment,)
        else:
            break
    return current


def edges_of(files, module, path):
    text = expand_groups("".join(code_lines(path)))
    children = {m[-1] for m in files if len(m) == len(module) + 1 and m[: len(module)] == module}
    targets = set()
    for match in re.finditer(rf"\b((?:crate|super|self)(?:::{SEGMENT})+)", text):
        segments = match.group(1).split("::")
        base = () if segments[0] == "crate" else module
        rest = segments[1:] if segments[0] == "crate" else segments
        targets.add(resolve(files, base, rest))
    for match in re.finditer(rf"(?<![:\w])({SEGMENT})::", text):
        if match.group(1) in children:
            tail = text[match.start():].split()[0]
            segments = re.findall(SEGMENT, tail.split("(")[0])
            targets.add(resolve(files, module, segments))
    targets.discard(module)
    return targets


def cycles(graph):
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    show = "--print" in sys.argv
    failed = False
    for crate in sorted(os.listdir("crates")):
        src = os.path.join("crates", crate, "src")
        if not os.path.isdir(src):
            continue
        files = module_files(src)
        graph = {m: {t for t in edges_of(files, m, f) if t in files} for m, f in files.items()}
        name = lambda m: "::".join(m) or "<root>"
        if show:
            for m in sorted(graph):
                print(f"{crate}: {name(m)} -> {', '.join(name(t) for t in sorted(graph[m])) or '-'}")
        for component in cycles(graph):
            failed = True
            print(f"file cycle in {crate}: {' <-> '.join(name(m) for m in component)}")
        top = {}
        for m, targets in graph.items():
            if m:
                top.setdefault(m[:1], set()).update(t[:1] for t in targets if t and t[:1] != m[:1])
        for component in cycles(top):
            failed = True
            print(f"module cycle in {crate}: {' <-> '.join(name(m) for m in component)}")
    if not failed:
        print("module graph: every crate's source files and top-level modules form acyclic graphs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
