#!/usr/bin/env python3
"""The include graph of include/attnkit/ by folder: each folder is a floor, and a header may
include its own floor and the floors below it. Prints the includes that run upward (a file
including a floor above its own), the folder-level cycles (strongly connected folders) and
each folder's edges. The umbrella attnkit.hpp includes everything and is left out.

  scripts/include_floors.py [--edges] [--check]
      --check: exit status 1 when an include runs upward or folders form a cycle (the test
      "include floors" runs it so).
"""
import collections
import os
import re
import sys

# The floors, lowest first: what a folder may include is itself and what precedes it. core/
# is the vocabulary (Index, Error, Span, View); the root holds the call (spec.hpp and
# problem.hpp name policies, so it sits above the policy folders and below kernel/).
FLOORS = ['core', 'simd', 'detail', 'storage', 'gemm', 'score', 'mask', 'normalizer',
          'position', '.', 'kernel/tiles', 'kernel/decode', 'kernel/backward', 'kernel', 'reference', 'select/detail', 'select', 'linear', 'gated', 'dsa', 'cache',
          'distributed']
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'include', 'attnkit')
INCLUDE = re.compile(r'#include "attnkit/([^"]+)"')


def folder_of(rel):
    return os.path.dirname(rel) or '.'


def main():
    edges = collections.defaultdict(set)
    upward = []
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT)
            if rel == 'attnkit.hpp':
                continue
            src = folder_of(rel)
            for target in INCLUDE.findall(open(path).read()):
                dst = folder_of(target)
                if dst == src:
                    continue
                edges[src].add(dst)
                if FLOORS.index(dst) > FLOORS.index(src):
                    upward.append((rel, target))
    # Tarjan's strongly connected components over the folders.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            sccs.append(sorted(scc))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    cycles = [s for s in sccs if len(s) > 1]
    print(f'upward includes: {len(upward)}')
    for rel, target in sorted(upward):
        print(f'  {rel} -> {target}')
    print(f'folder-level cycles: {len(cycles)}')
    for scc in cycles:
        print('  ' + ', '.join(scc))
    if '--edges' in sys.argv:
        for src in sorted(edges):
            print(f'{src} -> {", ".join(sorted(edges[src]))}')
    if '--check' in sys.argv and (upward or cycles):
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
