#!/usr/bin/env python3
"""loom:: holds what users write: this lists the names declared directly in namespace loom
by <loom/loom.hpp> and the input pipelines' headers (<loom/data/...>, which loom.hpp leaves
to the programs that read files) and compares them with tests/public_names.txt.

A new internal that lands in loom:: (instead of loom::detail, loom::kernels, loom::net, ...)
fails `make test` here, and so does a public name that disappears. When the change is meant,
run with --update and commit the list with the change.

The unit is parsed as a program's unit that links loom::kernels sees it
(LOOM_COMPILED_KERNELS: the compiled-once bodies are declarations, core/compiled_once.hpp),
with the runtime's headers that <loom/loom.hpp> adds outside such a program: the same
declarations in a tenth of the time. The CPU kernels' headers are left out: they declare into
loom::kernels and loom::ops, and parsing them instantiates every kernel's registration (two
minutes of clang).

The names come from clang itself (-Xclang -ast-list prints every declaration's qualified
name), so templates split over lines, macros and using-declarations count as the compiler
sees them. clang also lists a function template's template parameters at the enclosing
namespace (loom::T); one-letter names are dropped for that reason, and loom declares no
one-letter name of its own.

Usage: check_public_names.py --list tests/public_names.txt [--update] -- <clang++> <flags...>
Exit status: 0 the lists agree, 1 they differ, 77 skipped (the compiler is not clang).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


TRANSLATION_UNIT = """#ifndef LOOM_COMPILED_KERNELS
#define LOOM_COMPILED_KERNELS
#endif
#include <loom/loom.hpp>
#include <loom/runtime/linked_runtime.hpp>
#include <loom/data/batcher.hpp>
#include <loom/data/mnist.hpp>
#include <loom/data/pipeline.hpp>
"""


def declared_names(compiler_and_flags):
    with tempfile.TemporaryDirectory() as tmp:
        tu = os.path.join(tmp, "public_names.cpp")
        with open(tu, "w") as f:
            f.write(TRANSLATION_UNIT)
        cmd = compiler_and_flags + ["-fsyntax-only", "-Xclang", "-ast-list", tu]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stderr[-4000:])
        raise SystemExit(f"check_public_names: {cmd[0]} could not parse loom's headers")
    names = set()
    for line in run.stdout.splitlines():
        m = re.fullmatch(r"loom::(\w+)", line.strip())
        if m and len(m.group(1)) > 1:
            names.add(m.group(1))
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", required=True, help="the committed list of loom::'s names")
    ap.add_argument("--update", action="store_true", help="rewrite the list from the headers")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- <clang++> <flags...>")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no compiler given after --")
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True).stdout
    if "clang" not in version:
        print(f"skipped: {command[0]} is not clang (the names come from clang's -ast-list)")
        return 77

    found = declared_names(command)
    if args.update:
        with open(args.list, "w") as f:
            f.write("# The names declared directly in namespace loom: what users write.\n")
            f.write("# Checked by tools/check_public_names.py (`make test`); --update rewrites it.\n")
            for n in sorted(found):
                f.write(n + "\n")
        print(f"{args.list}: {len(found)} names")
        return 0

    with open(args.list) as f:
        listed = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    added, gone = sorted(found - listed), sorted(listed - found)
    if not added and not gone:
        print(f"loom:: declares the {len(found)} names of {args.list}")
        return 0
    if added:
        print(f"declared in loom:: but not in {args.list} (an internal belongs in loom::detail, "
              "or its layer's namespace; a new public name goes in the list):")
        for n in added:
            print("  + loom::" + n)
    if gone:
        print(f"in {args.list} but no longer declared in loom::")
        for n in gone:
            print("  - loom::" + n)
    print("if the change is meant: tools/check_public_names.py --update (see its header)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
