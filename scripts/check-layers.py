#!/usr/bin/env python3
"""Checks that no two sibling modules of a crate use each other, directly or in a cycle.

The layering rule of docs/architecture.md ("Why it is built this way", Layering): inside a
crate, arrows between sibling modules run one way; a parent and its children aside (a
parent re-exports its children, a child uses its parent's items). A piece that two
siblings need goes below both.

Every crate of the repository is checked: each directory with a `Cargo.toml` and a `src/`
(the workspace's members, the Python package's crate, examples, fuzz targets), build
outputs, virtual environments and hidden directories left out. A module is a file of
`src/` (`lib.rs`/`main.rs` the crate root, `mod.rs` its directory); `src/bin/` is left out.

A module `a::x` references module `a::y` when its code names a path into `a::y`: a `use`
(`crate::`, `super::`, `self::` or a child's name) or a path in code (`crate::a::y::f()`,
`super::y::T`). A name reached through a re-export (`pub use y::T;` in `a`, any `use` in
fact) counts as a reference to the module it comes from, following re-exports of
re-exports. A reference between two modules where one contains the other is no edge; any
other becomes an edge between the two siblings below their closest common ancestor (`a::x`
-> `a::y::z` is the edge `a::x` -> `a::y`).

Left out: comments (doc comments too: a link in one is no dependency), string and
character literals, and items compiled only for tests (`#[cfg(test)] mod tests { ... }`,
`#[cfg(test)] mod tests;`, any other `#[cfg(test)]` item). Names brought in by a glob
(`use x::*`) are not followed; a macro's `$crate::` paths are its callers' business.

Usage: scripts/check-layers.py [ROOT]   (ROOT: the repository, by default this script's)

Exit status: 0 when no crate has a cycle; 1 when one has, each cycle printed with its
crate, one path around it, and every edge among its modules with where it comes from;
2 on a usage error.
"""

import os
import re
import sys

SKIP_DIRS = {"target", "node_modules", ".venv", "venv", "__pycache__"}
ITEM_KEYWORDS = {
    "mod",
    "use",
    "fn",
    "impl",
    "struct",
    "enum",
    "trait",
    "const",
    "static",
    "type",
    "pub",
    "unsafe",
    "extern",
    "async",
    "macro_rules",
}


def find_crates(root):
    """Directories under `root` holding a `Cargo.toml` with a `[package]` and a `src/`."""
    crates = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
        )
        if "Cargo.toml" not in files or not os.path.isdir(os.path.join(dirpath, "src")):
            continue
        with open(os.path.join(dirpath, "Cargo.toml"), encoding="utf-8") as f:
            if re.search(r"^\[package\]", f.read(), re.MULTILINE):
                crates.append(dirpath)
    return crates


def module_files(src):
    """Module path (a tuple of names; () for the crate root) -> file, for `src/`."""
    mods = {}
    for dirpath, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[0] == "bin":
                continue
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            mods[tuple(parts)] = path
    return mods


def blank(text, start, end):
    """`text` with `[start, end)` replaced by spaces, its line breaks kept."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def strip_literals_and_comments(text):
    """Comments and the contents of string and character literals blanked out (line breaks
    kept, so that line numbers still hold)."""
    out = []
    i, n = 0, len(text)

    def keep_lines(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_lines(text[i:j]))
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
            out.append(keep_lines(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(keep_lines(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{..}'), or else a lifetime or label.
            m = re.compile(r"'(?:\\u\{[0-9a-fA-F_]*\}|\\.|[^\\'\n])'").match(text, i)
            if m:
                out.append(keep_lines(m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, at):
    """Index just past the `}` closing the `{` at `at`."""
    depth = 0
    for j in range(at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*\[[^\]]*\]")
TEST_MOD_FILE = re.compile(r"\s*(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def strip_test_items(code):
    """`code` (comments and literals already blanked) with every `#[cfg(test)]` item
    blanked; returns it and the names of child modules declared `#[cfg(test)] mod x;`."""
    test_files = set()
    pos = 0
    while m := CFG_TEST.search(code, pos):
        j = m.end()
        while a := ATTRIBUTE.match(code, j):
            j = a.end()
        word = re.compile(r"\s*(\w+)").match(code, j)
        if not word or word.group(1) not in ITEM_KEYWORDS:
            pos = m.end()
            continue
        if f := TEST_MOD_FILE.match(code, j):
            test_files.add(f.group(1))
        semi, brace = code.find(";", j), code.find("{", j)
        if brace >= 0 and (semi < 0 or brace < semi):
            end = matching_brace(code, brace)
        else:
            end = len(code) if semi < 0 else semi + 1
        code = blank(code, m.start(), end)
        pos = end
    return code, test_files


def split_top(s, sep=","):
    """`s` split at `sep` outside braces."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand_use_tree(tree):
    """The paths of a use tree, each as (segments, the local name it binds or None):
    `a::{b, c::{d as e, self}}` -> (a,b) b, (a,c,d) e, (a,c) c. Globs are dropped."""
    tree = re.sub(r"\s+", " ", tree).strip().lstrip(":").strip()
    brace = tree.find("{")
    if brace >= 0 and tree.endswith("}"):
        prefix = [p.strip() for p in tree[:brace].split("::") if p.strip()]
        out = []
        for sub in split_top(tree[brace + 1 : -1]):
            for segs, name in expand_use_tree(sub):
                if segs == ["self"]:
                    out.append((prefix, name if name != "self" else prefix[-1]))
                else:
                    out.append((prefix + segs, name))
        return out
    alias = None
    m = re.fullmatch(r"(.*?)\s+as\s+(\w+)", tree)
    if m:
        tree, alias = m.group(1), m.group(2)
    segs = [p.strip() for p in tree.split("::") if p.strip()]
    if not segs or segs[-1] == "*":
        return []
    return [(segs, alias or segs[-1])]


def absolute(segs, module, mods, relative_children):
    """`segs` (a path as written in `module`) as an absolute module path, or None when it
    leaves the crate (std, another crate). Relative paths are taken as the child
    modules' only when `relative_children` (a `use` path)."""
    head = segs[0]
    if head == "crate":
        base, rest = [], segs[1:]
    elif head in ("super", "self"):
        base, rest = list(module), segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif relative_children and tuple(module) + (head,) in mods:
        base, rest = list(module), segs
    else:
        return None
    return tuple(base + rest)


USE_DECL = re.compile(r"\buse\s+([^;]+);")
CODE_PATH = re.compile(r"(?<![\w$])(?:crate|super|self)(?:\s*::\s*\w+)+")


def line_of(text, at):
    return text.count("\n", 0, at) + 1


class Crate:
    def __init__(self, root):
        self.root = root
        self.src = os.path.join(root, "src")
        self.mods = module_files(self.src)
        self.code = {}
        test_only = set()
        for mod, path in self.mods.items():
            with open(path, encoding="utf-8") as f:
                code = strip_literals_and_comments(f.read())
            self.code[mod], tests = strip_test_items(code)
            test_only.update(mod + (t,) for t in tests)
        for mod in list(self.mods):
            if any(mod[: len(t)] == t for t in test_only):
                del self.mods[mod], self.code[mod]
        # module -> local name -> absolute path it was imported from (re-exports included)
        self.imports = {m: {} for m in self.mods}
        # module -> [(absolute path, line)] it references
        self.refs = {m: [] for m in self.mods}
        for mod, code in self.code.items():
            for u in USE_DECL.finditer(code):
                for segs, name in expand_use_tree(u.group(1)):
                    path = absolute(segs, mod, self.mods, relative_children=True)
                    if path is None:
                        continue
                    if name and name != "_":
                        self.imports[mod][name] = path
                    self.refs[mod].append((path, line_of(code, u.start())))
            uses_blanked = USE_DECL.sub(
                lambda u: re.sub(r"[^\n]", " ", u.group(0)), code
            )
            for p in CODE_PATH.finditer(uses_blanked):
                segs = [s.strip() for s in p.group(0).split("::")]
                path = absolute(segs, mod, self.mods, relative_children=False)
                if path is not None:
                    self.refs[mod].append((path, line_of(code, p.start())))

    def resolve(self, path, seen=()):
        """The module that `path` (absolute) leads to: its longest prefix that is a module,
        or, where the next name was imported there, the module that name comes from."""
        for n in range(len(path), -1, -1):
            mod = path[:n]
            if mod not in self.mods:
                continue
            if n < len(path):
                src = self.imports[mod].get(path[n])
                if src is not None and src not in seen:
                    return self.resolve(src + path[n + 1 :], seen + (src,))
            return mod
        return None

    def edges(self):
        """(from, to) sibling pair -> [(file, line, the path named)]."""
        out = {}
        for mod, refs in self.refs.items():
            for path, line in refs:
                target = self.resolve(path)
                if target is None:
                    continue
                k = 0
                while k < min(len(mod), len(target)) and mod[k] == target[k]:
                    k += 1
                if k == len(mod) or k == len(target):
                    continue  # one contains the other
                rel = os.path.relpath(self.mods[mod], self.root)
                out.setdefault((mod[: k + 1], target[: k + 1]), []).append(
                    (rel, line, "::".join(path))
                )
        return out


def strongly_connected(graph):
    """Components of more than one node of `graph` (node -> successors), Tarjan's
    algorithm without recursion."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, succ = work[-1]
            for w in succ:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return comps


def one_cycle(comp, graph):
    """A path around a component: from its first module back to it (breadth first)."""
    members, start = set(comp), comp[0]
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def display(mod):
    return "::".join(mod) or "(crate root)"


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print(__doc__.strip().split("\n\n")[-2], file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    crates = find_crates(root)
    cycles = 0
    for path in crates:
        crate = Crate(path)
        edges = crate.edges()
        graph = {}
        for a, b in edges:
            graph.setdefault(a, set()).add(b)
        for comp in strongly_connected(graph):
            cycles += 1
            print(
                f"{os.path.relpath(path, root)}: sibling modules in a cycle: "
                + " -> ".join(display(m) for m in one_cycle(comp, graph))
            )
            for a in comp:
                for b in comp:
                    for file, line, named in sorted(set(edges.get((a, b), []))):
                        print(
                            f"    {display(a)} -> {display(b)}: {file}:{line}: {named}"
                        )
    if cycles:
        print(
            f"check-layers: {cycles} cycle(s) among sibling modules; move what both "
            "need below both (see docs/architecture.md, Layering)"
        )
        return 1
    print(f"check-layers: no cycle among sibling modules ({len(crates)} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
