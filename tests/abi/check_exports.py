#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Compare src/hixl.map, include/hixl.h and the built libhixl.so's exports.

    check_exports.py MAP HEADER LIBRARY

Fails (exit 1), naming each offending symbol, when
  - the library exports a name the map does not list (a leaked internal);
  - the map lists a name the library does not export;
  - a function declared in the header is not in the map or not exported;
  - the map lists a name the header does not declare;
  - an exported name is not versioned with the map node that lists it
    (hixl_put@@HIXL_1.0), or is unversioned;
  - the map uses a wildcard in a global list, lists a name twice, or a
    node's names are not sorted.
The dynamic symbols and their versions come from readelf --dyn-syms.
"""

import re
import shutil
import subprocess
import sys


def strip_c(text):
    """The header without comments, preprocessor lines and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)
    text = re.sub(r'extern\s+"C"\s*\{', " ", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def header_functions(path):
    """Names of the functions the header declares at file scope.

    Typedefs (function pointer or function types), static or inline
    definitions, macros and calls in comments are not declarations of
    exported functions and are left out."""
    with open(path, encoding="utf-8") as f:
        text = strip_c(f.read())
    # Split into file-scope statements: text up to ';' at depth 0, with
    # brace bodies (structs, enums, inline function bodies) kept as '{}'.
    statements, cur, depth = [], [], 0
    for ch in text:
        if ch == "{":
            if depth == 0:
                cur.append("{}")
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
            if depth == 0 and re.search(r"\)\s*(?:__attribute__\s*\(\(.*\)\)\s*)?\{\}$",
                                        "".join(cur)):
                statements.append("".join(cur))  # a function definition ends here
                cur = []
        elif depth == 0:
            if ch == ";":
                statements.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
    names = []
    for s in statements:
        s = " ".join(s.split())
        if re.match(r"(?:typedef|static)\b", s) or re.search(r"\binline\b", s):
            continue
        if s.startswith("{}") or re.match(r"^(?:struct|enum|union)\b[^(]*$", s):
            continue
        # The declarator: the first hixl_name( not inside a (*name) pointer.
        m = re.search(r"\b(hixl_\w+)\s*\(", s)
        if m and not re.search(r"\(\s*\*\s*" + m.group(1) + r"\b", s):
            names.append(m.group(1))
    return names


def map_nodes(path):
    """[(node, parent, [names]), ...] and the problems found in the script."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"#[^\n]*", " ", text)
    problems, nodes = [], []
    for m in re.finditer(r"([\w.]+)\s*\{(.*?)\}\s*([\w.]*)\s*;", text, flags=re.S):
        node, body, parent = m.group(1), m.group(2), m.group(3) or None
        names = []
        section = None
        for part in body.split(";"):
            part = part.strip()
            sm = re.match(r"(global|local)\s*:\s*(.*)$", part, flags=re.S)
            if sm:
                section, part = sm.group(1), sm.group(2).strip()
            if not part:
                continue
            if section == "local":
                if part != "*":
                    problems.append(f"{node}: local entry '{part}' (only '*' belongs there)")
                continue
            if re.search(r"[*?\[]", part):
                problems.append(f"{node}: wildcard '{part}' in the global list"
                                " (list every exported name)")
                continue
            names.append(part)
        for n in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{node}: {n} listed {names.count(n)} times")
        for prev, n in zip(names, names[1:]):
            if n < prev:
                problems.append(f"{node}: {n} after {prev} (keep each node's names sorted)")
        nodes.append((node, parent, names))
    if not nodes:
        problems.append("no version node found")
    known = {n for n, _, _ in nodes}
    for node, parent, _ in nodes:
        if parent and parent not in known:
            problems.append(f"{node} inherits {parent}, which the map does not define")
    return nodes, problems


def library_exports(path):
    """{name: [(version or None, default version?)]} of the defined dynamic
    symbols, and the version nodes the library defines."""
    readelf = shutil.which("readelf")
    if not readelf:
        sys.exit("check_exports: readelf (binutils) not found")
    out = subprocess.run([readelf, "--dyn-syms", "--wide", path], check=True,
                         capture_output=True, text=True).stdout
    syms, versions = {}, set()
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name [(verindex)]
        if len(f) < 8 or not f[0].endswith(":") or not f[0][:-1].isdigit():
            continue
        size, typ, bind, vis, ndx, name = f[2], f[3], f[4], f[5], f[6], f[7]
        if ndx == "UND" or bind == "LOCAL" or vis in ("HIDDEN", "INTERNAL"):
            continue
        if "@" in name:
            base, sep, ver = name.partition("@@") if "@@" in name else name.partition("@")
            default = sep == "@@"
        else:
            base, ver, default = name, None, True
        if ndx == "ABS" and typ == "OBJECT" and size == "0" and ver in (None, base):
            versions.add(base)  # a version definition (HIXL_1.0, or HIXL_1.0@@HIXL_1.0)
            continue
        if not base:
            continue
        syms.setdefault(base, []).append((ver or None, default))
    return syms, versions


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    map_path, header_path, lib_path = argv[1:]
    errors = []
    declared = header_functions(header_path)
    nodes, map_problems = map_nodes(map_path)
    errors += [f"{map_path}: {p}" for p in map_problems]
    in_map = {}
    for node, _, names in nodes:
        for n in names:
            if n in in_map and in_map[n] != node:
                errors.append(f"{n}: listed in {in_map[n]} and in {node}")
            in_map.setdefault(n, node)
    exports, lib_versions = library_exports(lib_path)
    for v in sorted(lib_versions - {n for n, _, _ in nodes}):
        errors.append(f"{v}: a version the library defines but {map_path} does not")
    exported = {n for n, vs in exports.items() if any(d for _, d in vs)}

    for n in sorted(exported - set(in_map)):
        errors.append(f"{n}: exported by {lib_path} but not in {map_path}"
                      " (an internal leaking out, or a function missing from the map)")
    for n in sorted(set(in_map) - exported):
        errors.append(f"{n}: listed in {map_path} ({in_map[n]}) but not exported by {lib_path}")
    for n in sorted(set(declared)):
        if n not in in_map:
            errors.append(f"{n}: declared in {header_path} but not in {map_path}")
        if n not in exported:
            errors.append(f"{n}: declared in {header_path} but not exported by {lib_path}")
    for n in sorted(set(in_map) - set(declared)):
        errors.append(f"{n}: listed in {map_path} but not declared in {header_path}")
    for n in sorted(exports):
        for ver, default in exports[n]:
            if default and n in in_map and ver != in_map[n]:
                got = f"version {ver}" if ver else "no version"
                errors.append(f"{n}: exported with {got}, expected {in_map[n]}"
                              f" ({n}@@{in_map[n]}; is the map passed to the linker?)")
            elif not default and ver not in {node for node, _, _ in nodes}:
                errors.append(f"{n}@{ver}: an old version the map does not define")

    if errors:
        print(f"check_exports: {len(errors)} problem(s):")
        for e in errors:
            print("  " + e)
        return 1
    print(f"check_exports: {len(exported)} functions, declared in {header_path}, listed in"
          f" {map_path} ({', '.join(n for n, _, _ in nodes)}) and exported with those versions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
