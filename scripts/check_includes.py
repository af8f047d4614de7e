#!/usr/bin/env python3
"""Checks that every `#include "module/..."` under src/ follows the module table of DESIGN.md §2.

Usage: scripts/check_includes.py [SRC_DIR]   (default: the src/ next to this script)

Reads every src/<module>/**/*.{h,cc,inc}; an include of "<other>/..." where <other> is a module
folder is allowed only when the table below lists <other> for <module> (a module may always
include itself). Prints one line per violation (file:line: rule) and exits 1 when there is any;
exit 0 when the tree is clean, 2 on a usage error. Standard library only (python3 from Debian).
"""

import pathlib
import re
import sys

# DESIGN.md §2: module -> the modules it may include (besides itself). Lower layers never include
# upper ones. Keep this table and the one in DESIGN.md identical.
_BELOW_CLI = (
    "common", "kv", "tokenizer", "chat", "kernels", "model", "engine", "fabric", "messenger",
    "http", "server", "router",
)
ALLOWED = {
    "common": (),
    "kv": ("common",),
    "tokenizer": ("common",),
    "chat": ("common",),
    "kernels": ("common", "kv"),
    "model": ("common", "kv", "kernels", "tokenizer"),
    "engine": ("common", "kv", "model", "tokenizer"),
    "fabric": ("common",),
    "messenger": ("common", "fabric", "kv", "engine"),
    "http": ("common",),
    "server": ("common", "http", "engine", "messenger", "chat", "tokenizer"),
    "router": ("common", "http"),
    "bench": _BELOW_CLI,  # everything below cli
    # Everything but the messenger (roles reach it through server/) and the router (only its
    # commands, below).
    "cli": tuple(m for m in _BELOW_CLI if m not in ("messenger", "router")) + ("bench",),
}

# Files that may include a module their module's row does not list: the commands that run a
# router (`pdserve router`, and `up`, which runs one in its own process).
EXCEPTIONS = {
    "cli/router.cc": ("router",),
    "cli/router_process.cc": ("router",),
    "cli/router_process.h": ("router",),
    "cli/up.cc": ("router",),
}

_EXTENSIONS = (".h", ".cc", ".inc")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"/]+)/[^"]*"')


def check(src: pathlib.Path) -> list[str]:
    errors = []
    for module_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        module = module_dir.name
        files = sorted(f for f in module_dir.rglob("*") if f.suffix in _EXTENSIONS and f.is_file())
        if module not in ALLOWED:
            if files:
                errors.append(f"{module_dir}: module '{module}' is not in the table of "
                              "scripts/check_includes.py (DESIGN.md §2); add it there first")
            continue
        for path in files:
            allowed = set(ALLOWED[module]) | {module}
            allowed |= set(EXCEPTIONS.get(path.relative_to(src).as_posix(), ()))
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                match = _INCLUDE.match(line)
                if match is None:
                    continue
                target = match.group(1)
                # Only module folders are governed; "foo/bar.h" of a third-party library is not.
                if target not in ALLOWED or target in allowed:
                    continue
                may_use = ", ".join(ALLOWED[module]) or "nothing"
                errors.append(f"{path.relative_to(src.parent)}:{number}: {module}/ may not include {target}/ "
                              f"({module} may use: {may_use}): {line.strip()}")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = pathlib.Path(argv[1]) if len(argv) == 2 else pathlib.Path(__file__).parent.parent / "src"
    if not src.is_dir():
        print(f"check_includes: {src} is not a directory", file=sys.stderr)
        return 2
    errors = check(src)
    for error in errors:
        print(error)
    if errors:
        print(f"check_includes: {len(errors)} include(s) break DESIGN.md §2", file=sys.stderr)
        return 1
    print(f"check_includes: {src}: every module include follows DESIGN.md §2")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
