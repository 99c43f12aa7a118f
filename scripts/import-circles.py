#!/usr/bin/env python3
"""Circles in the workspace's import graph, one crate at a time (docs/architecture.md).

A node is a source file of a crate's `src/`, named by its module path. A file imports another
when a `use` declaration or a path in its code (`crate::…`, `super::…`, `self::…`) names an item
of that module, or an item re-exported elsewhere (`pub use`) that the other module defines. A module's use of its own descendants is left out: a parent declares its
children, and its trait's defaults or its re-exports reach into them by design; a child's use of
its parent counts (`--with-descendants` counts both). The script prints every strongly connected set of two or more files and exits
with 1 when there are more than `--most` (default: no limit).

    python3 scripts/import-circles.py [--most N] [--with-descendants] [crate directory ...]
"""

import argparse
import pathlib
import re
import sys

USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
INLINE = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_]\w*)+)")
MOD = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
COMMENT = re.compile(r"//[^\n]*")
WITH_DESCENDANTS = "--with-descendants" in sys.argv


def module_files(src: pathlib.Path) -> dict[tuple[str, ...], pathlib.Path]:
    """Every module of the crate that has a file, by its path from the crate root."""
    modules = {}
    for path in src.rglob("*.rs"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts in (["lib"], ["main"]):
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        elif parts[0] == "bin":
            continue
        modules[tuple(parts)] = path
    return modules


def expand(tree: str) -> list[str]:
    """The paths of one `use` tree: `a::{b, c::{d, e as f}}` gives a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, rest = tree.split("{", 1)
    body = rest[: rest.rindex("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    paths = []
    for item in filter(None, items):
        for path in expand(item):
            paths.append(head + path if path != "self" else head.rstrip(":"))
    return paths


def resolve(path: str, here: tuple[str, ...], modules, reexports=None) -> tuple[str, ...] | None:
    """The module that defines what `path` names, read from module `here`: its longest module
    prefix, or the module an item re-exported there (`pub use`) comes from."""
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] in ("super", "self"):
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts.pop(0) == "super":
                base = base[:-1]
    else:
        base = list(here)  # a child module named from its parent (or a crate: not found)
    full = base + parts
    for length in range(len(full), len(base) - 1, -1):
        module = tuple(full[:length])
        if module in modules:
            item = full[length] if length < len(full) else None
            origin = (reexports or {}).get((module, item))
            return origin if origin is not None and origin != module else module
    return None


PUB_USE = re.compile(r"^\s*pub(?:\([^)]*\))?\s+use\s+([^;]+);", re.M)


def reexports_of(modules) -> dict:
    """(module, item) → the module the item comes from, for every `pub use` of a module."""
    found = {}
    for name, path in modules.items():
        text = COMMENT.sub("", path.read_text())
        for tree in PUB_USE.findall(text):
            for p in expand(tree):
                item = p.split("::")[-1]
                target = resolve(p, name, modules)
                if target is not None:
                    found[(name, item)] = target
    # Follow chains of re-exports to where the item is defined.
    for _ in range(8):
        for key, target in list(found.items()):
            further = found.get((target, key[1]))
            if further is not None and further != target:
                found[key] = further
    return found


def edges_of(crate: pathlib.Path):
    src = crate / "src"
    modules = module_files(src)
    reexports = reexports_of(modules)
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        text = COMMENT.sub("", path.read_text())
        children = set(MOD.findall(text))
        paths = [p for tree in USE.findall(text) for p in expand(tree)]
        paths += INLINE.findall(text)
        for p in paths:
            first = p.split("::")[0]
            if first not in ("crate", "super", "self") and first not in children:
                continue  # another crate, std, or a name imported above
            target = resolve(p, name, modules, reexports)
            if target is None or target == name or (not WITH_DESCENDANTS and target[: len(name)] == name):
                continue  # itself, or one of its own descendants
            edges[name].add(target)
    return edges


def circles(edges):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

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
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--most", type=int, default=None, help="fail above this many circles")
    parser.add_argument(
        "--with-descendants",
        action="store_true",
        help="count a module's use of its own descendants too",
    )
    parser.add_argument("crates", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    crates = args.crates or sorted(p.parent for p in (root / "crates").glob("*/Cargo.toml"))
    total = 0
    for crate in crates:
        for component in circles(edges_of(crate)):
            total += 1
            names = ["::".join(m) or "(root)" for m in component]
            print(f"{crate.name}: {' <-> '.join(names)}")
    print(f"{total} circle(s)")
    if args.most is not None and total > args.most:
        sys.exit(1)


if __name__ == "__main__":
    main()
