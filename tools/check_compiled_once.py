#!/usr/bin/env python3
"""Checks that loom::kernels' unit defines every function a header declares compiled once.

A header's LOOM_COMPILED_ONCE functions are only declared in the units of a program that
links loom::kernels (core/compiled_once.hpp); their one definition is compiled in that
target's unit, cmake/loom_kernels.cpp, which must therefore include every header holding a
`#if LOOM_COMPILED_ONCE_DEFINITIONS` block, directly or through another header. A header
left out links in this tree only while no program calls what it moved, so this is checked
here, by the include lines, instead of waiting for a user's link error.

Usage: check_compiled_once.py --root REPO
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*<(loom/[^>]+)>', re.M)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--root', required=True, type=pathlib.Path)
    args = parser.parse_args()
    include_dir = args.root / 'include'
    unit = args.root / 'cmake' / 'loom_kernels.cpp'

    # Every header the unit includes, following every include line (a conditional one
    # too: the unit defines LOOM_KERNELS_UNIT, under which loom's headers include all).
    reached = set()
    pending = INCLUDE.findall(unit.read_text())
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        path = include_dir / name
        if not path.is_file():
            print(f'{unit}: includes <{name}>, which is not under {include_dir}')
            return 1
        reached.add(name)
        pending.extend(INCLUDE.findall(path.read_text()))

    holders = sorted(
        str(p.relative_to(include_dir)) for p in include_dir.rglob('*.hpp')
        if '#if LOOM_COMPILED_ONCE_DEFINITIONS' in p.read_text())
    missing = [h for h in holders if h not in reached]
    for h in missing:
        print(f'include/{h}: defines LOOM_COMPILED_ONCE functions, but {unit.relative_to(args.root)} '
              f'does not include it: a program that calls one of them will not link; include it there')
    if missing:
        return 1
    print(f'{len(holders)} headers define compiled-once functions; cmake/loom_kernels.cpp '
          f'includes each ({len(reached)} headers reached)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
