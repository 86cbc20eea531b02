"""Copies an installed distribution and everything it requires (with their
metadata, which some read at import) into a
directory (argv[2]) that a sandboxed agent can put on sys.path: the
sandbox sees the host's /usr, not this Python's site-packages.

usage: vendor.py <distribution> <dest>
"""

import importlib.metadata as md
import os
import re
import shutil
import sys


def closure(name):
    seen, stack = {}, [name]
    while stack:
        n = re.sub(r"[-_.]+", "-", stack.pop()).lower()
        if n in seen:
            continue
        try:
            dist = md.distribution(n)
        except md.PackageNotFoundError:
            continue  # an optional or platform-specific requirement
        seen[n] = dist
        for req in dist.requires or []:
            if "extra ==" in req or "sys_platform == \"win32\"" in req:
                continue
            stack.append(re.split(r"[ ;<>=!~\[(]", req)[0])
    return seen.values()


def main():
    name, dest = sys.argv[1], sys.argv[2]
    os.makedirs(dest, exist_ok=True)
    for dist in closure(name):
        tops = set()
        for f in dist.files or []:
            top = f.parts[0]
            if top == ".." or top.startswith("__pycache__"):
                continue
            tops.add(top)
        for top in tops:
            src = os.path.join(str(dist.locate_file("")), top)
            dst = os.path.join(dest, top)
            if os.path.exists(dst) or not os.path.exists(src):
                continue
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
    print(dest)


if __name__ == "__main__":
    main()
