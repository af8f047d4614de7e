#!/usr/bin/env python3
"""Runs clang's thread-safety analysis over every src/ translation unit.

Usage: scripts/check_thread_safety.py [-b BUILD_DIR] [-j N] [PATH...]
  (defaults: build, 2, all of src/; PATHs limit the check to files under them)

Takes each src/ file's include directories, defines, language and target flags from
BUILD_DIR/compile_commands.json (written by CMake; GCC builds the objects) and runs
`clang++ -fsyntax-only -Wthread-safety -Werror` on it, N at a time. Exit 1 when any file has a
diagnostic (printed), 0 when all are clean, 2 when the compile database is missing. Standard
library only (python3 from Debian).
"""

import concurrent.futures
import json
import pathlib
import shlex
import subprocess
import sys
import time

CLANG = "clang++"
CHECK_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror"]
# Flags carried over from the GCC command: what decides how the file parses, not GCC warnings.
_KEEP_PREFIXES = ("-I", "-isystem", "-D", "-U", "-std=", "-m", "-include")
_KEEP_EXACT = ("-fopenmp", "-pthread")
_WITH_ARGUMENT = ("-I", "-isystem", "-D", "-U", "-include")


def clang_command(entry: dict) -> list[str]:
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [CLANG, *CHECK_FLAGS]
    i = 1
    while i < len(args):
        arg = args[i]
        if arg in _WITH_ARGUMENT and i + 1 < len(args):
            out += [arg, args[i + 1]]
            i += 2
            continue
        if arg.startswith(_KEEP_PREFIXES) or arg in _KEEP_EXACT:
            out.append(arg)
        i += 1
    out.append(entry["file"])
    return out


def main(argv: list[str]) -> int:
    build = pathlib.Path("build")
    jobs = 2
    limits = []
    rest = argv[1:]
    while rest:
        if rest[0] in ("-j", "-b") and len(rest) > 1:
            if rest[0] == "-j":
                jobs = int(rest[1])
            else:
                build = pathlib.Path(rest[1])
            rest = rest[2:]
        else:
            limits.append(pathlib.Path(rest[0]).resolve())
            rest = rest[1:]
    database = build / "compile_commands.json"
    if not database.is_file():
        print(f"check_thread_safety: {database} is missing (configure with CMake first)",
              file=sys.stderr)
        return 2
    root = pathlib.Path(__file__).resolve().parent.parent
    src = root / "src"
    limits = limits or [src]
    entries = [e for e in json.loads(database.read_text())
               if pathlib.Path(e["file"]).resolve().is_relative_to(src)
               and any(pathlib.Path(e["file"]).resolve().is_relative_to(p) for p in limits)]
    if not entries:
        print(f"check_thread_safety: no src/ file in {database}", file=sys.stderr)
        return 2

    def check(entry: dict) -> tuple[str, int, str]:
        result = subprocess.run(clang_command(entry), cwd=entry["directory"], capture_output=True,
                                text=True, timeout=600, check=False)
        return entry["file"], result.returncode, result.stdout + result.stderr

    start = time.monotonic()
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for file, code, output in pool.map(check, entries):
            if code != 0:
                failed += 1
                print(output, end="")
                print(f"check_thread_safety: FAILED {file}")
    seconds = time.monotonic() - start
    if failed:
        print(f"check_thread_safety: {failed} of {len(entries)} file(s) fail "
              f"({seconds:.0f} s, -j {jobs})", file=sys.stderr)
        return 1
    print(f"check_thread_safety: {len(entries)} src/ files clean under -Wthread-safety "
          f"({seconds:.0f} s, -j {jobs})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
