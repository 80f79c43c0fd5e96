#!/usr/bin/env python3
"""Checks that the code the docs quote is the code in the repository, and that the docs'
links between each other land.

Snippets. A source marks a region with two comment lines (`//` in C++, `#` in Python, CMake
and shell):

    // [snippet:cluster-flags]
    ... the lines a doc quotes ...
    // [snippet-end:cluster-flags]

Regions may nest or overlap (each end names its start); marker lines never appear in a
quoted region. A doc quotes a region with an HTML comment on the line before a fenced block:

    <!-- snippet: examples/mnist_replica/main.cpp#cluster-flags -->
    ```cpp
    ... exactly the region's lines ...
    ```

The path is relative to the repository root. The check fails when a fenced block differs
from its region (a unified diff says how), when a doc names a file or region that does not
exist, or when a source's markers are unpaired or repeated. `--update` rewrites every quoted
block from its region instead (then check the diff and commit both).

Links. Every relative Markdown link from one doc to another (`[text](other.md#anchor)`,
`(#anchor)` within a page) must name a file that exists and, with an anchor, a heading of
that file (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens).

  tools/check_doc_snippets.py            # check README.md and docs/*.md; exit 1 on any error
  tools/check_doc_snippets.py --update   # rewrite the quoted blocks from the sources
  tools/check_doc_snippets.py --root DIR [DOC.md ...]

`make test` runs the check as the ctest entry doc_snippets (tests/CMakeLists.txt).
"""
import argparse
import difflib
import os
import re
import sys

DOC_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<path>[^#\s]+)#(?P<name>[A-Za-z0-9_.-]+)\s*-->\s*$")
SRC_START = re.compile(r"^\s*(?://|#)\s*\[snippet:(?P<name>[A-Za-z0-9_.-]+)\]\s*$")
SRC_END = re.compile(r"^\s*(?://|#)\s*\[snippet-end:(?P<name>[A-Za-z0-9_.-]+)\]\s*$")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


class Errors:
    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append(f"{where}: {message}")


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def source_regions(path, rel, errors, cache):
    """{name: [lines]} of the marked regions of a source file (marker lines left out)."""
    if rel in cache:
        return cache[rel]
    regions, open_at, done = {}, {}, set()
    lines = read_lines(path)
    for number, line in enumerate(lines, 1):
        start, end = SRC_START.match(line), SRC_END.match(line)
        if start:
            name = start["name"]
            if name in open_at or name in done:
                errors.add(f"{rel}:{number}", f"snippet '{name}' starts a second time")
                continue
            open_at[name] = number
            regions[name] = []
        elif end:
            name = end["name"]
            if name not in open_at:
                errors.add(f"{rel}:{number}", f"snippet-end '{name}' without its start")
                continue
            del open_at[name]
            done.add(name)
        else:
            for name in open_at:
                regions[name].append(line)
    for name, number in open_at.items():
        errors.add(f"{rel}:{number}", f"snippet '{name}' has no [snippet-end:{name}]")
        regions.pop(name, None)
    cache[rel] = regions
    return regions


def check_doc(root, doc, update, errors, cache):
    """Compares (or rewrites) each quoted block of `doc`; returns the number of quotes."""
    rel_doc = os.path.relpath(doc, root)
    lines = read_lines(doc)
    out, i, quotes, changed = [], 0, 0, False
    while i < len(lines):
        line = lines[i]
        out.append(line)
        marker = DOC_MARKER.match(line)
        i += 1
        if not marker:
            continue
        quotes += 1
        where = f"{rel_doc}:{i}"
        src_rel = marker["path"]
        src = os.path.join(root, src_rel)
        if not os.path.isfile(src):
            errors.add(where, f"{src_rel} does not exist")
            continue
        regions = source_regions(src, src_rel, errors, cache)
        name = marker["name"]
        if name not in regions:
            errors.add(where, f"{src_rel} has no region [snippet:{name}]")
            continue
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        if not fence:
            errors.add(where, "the snippet comment must be followed at once by a fenced block")
            continue
        close = next((j for j in range(i + 1, len(lines))
                      if lines[j].startswith(fence["fence"]) and not lines[j].strip(fence["fence"][0]).strip()),
                     None)
        if close is None:
            errors.add(where, "the fenced block after the snippet comment is not closed")
            continue
        quoted, wanted = lines[i + 1:close], regions[name]
        if quoted != wanted:
            if update:
                changed = True
            else:
                diff = difflib.unified_diff(quoted, wanted, f"{rel_doc} (quoted at line {i + 1})",
                                            f"{src_rel}#{name}", lineterm="", n=1)
                errors.add(where, f"the quoted block differs from {src_rel}#{name}:\n"
                           + "\n".join("    " + d for d in diff))
        out.append(lines[i])
        out.extend(wanted if update else quoted)
        out.append(lines[close])
        i = close + 1
    if update and changed:
        with open(doc, "w", encoding="utf-8") as f:
            f.write("\n".join(out))
        print(f"updated {rel_doc}")
    return quotes


def anchor_of(heading):
    """GitHub's anchor of a Markdown heading's text."""
    text = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache):
    if path not in cache:
        seen, result, in_fence = {}, set(), False
        for line in read_lines(path):
            if FENCE.match(line):
                in_fence = not in_fence
            if in_fence:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                a = anchor_of(m.group(1))
                n = seen.get(a, 0)
                seen[a] = n + 1
                result.add(a if n == 0 else f"{a}-{n}")
        cache[path] = result
    return cache[path]


def check_links(root, doc, errors, cache):
    rel_doc = os.path.relpath(doc, root)
    in_fence = False
    for number, line in enumerate(read_lines(doc), 1):
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(dest):
                errors.add(f"{rel_doc}:{number}", f"link to {target}: {path} does not exist")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest, cache):
                errors.add(f"{rel_doc}:{number}",
                           f"link to {target}: {os.path.relpath(dest, root)} has no heading "
                           f"whose anchor is #{anchor}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.path.dirname(here), help="the repository's root")
    p.add_argument("--update", action="store_true",
                   help="rewrite every quoted block from its source region")
    p.add_argument("docs", nargs="*", help="docs to check (default: README.md and docs/*.md)")
    args = p.parse_args()
    root = os.path.abspath(args.root)
    docs = [os.path.abspath(d) for d in args.docs]
    if not docs:
        docs = [os.path.join(root, "README.md")]
        docs += sorted(os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs"))
                       if f.endswith(".md"))
    errors, regions, heading_cache, quotes = Errors(), {}, {}, 0
    for doc in docs:
        quotes += check_doc(root, doc, args.update, errors, regions)
        check_links(root, doc, errors, heading_cache)
    for item in errors.items:
        print(item, file=sys.stderr)
    if errors.items:
        print(f"check_doc_snippets: {len(errors.items)} error(s) in {len(docs)} doc(s)"
              + ("" if args.update else "; `tools/check_doc_snippets.py --update` rewrites "
                 "quoted blocks from their sources"), file=sys.stderr)
        return 1
    print(f"check_doc_snippets: {quotes} quoted block(s) match their sources, "
          f"links of {len(docs)} doc(s) land")
    return 0


if __name__ == "__main__":
    sys.exit(main())
