#!/usr/bin/env python3
"""Runs clang's thread-safety analysis over the src/ translation units that can hold a finding.

Usage: scripts/check_thread_safety.py [-b BUILD_DIR] [-j N] [--all] [PATH...]
  (defaults: build, 2, all of src/; PATHs limit the check to files under them)

Takes each src/ file's include directories, defines, language and target flags from
BUILD_DIR/compile_commands.json (written by CMake; GCC builds the objects) and runs
`clang++ -fsyntax-only -Wthread-safety -Werror` on it, N at a time. A file batched into one of
CMake's unity sources (PDSERVE_UNITY_BUILD) is still checked alone, with its batch's flags.

The analysis can only report on code that sees a capability attribute, and only pdserve's own
headers carry them (common/thread_annotations.h; libstdc++ and the third-party headers have
none). So a file is checked when it, or a project header it includes directly or through other
project headers, spells one; the others are counted and skipped. --all checks every file.

Exit 1 when any file has a diagnostic (printed), 0 when all are clean, 2 when the compile
database is missing. Standard library only (python3 from Debian).
"""

import concurrent.futures
import json
import pathlib
import re
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


# A clang thread-safety attribute, as common/thread_annotations.h spells them.
_ANNOTATION = re.compile(r"\b(capability|scoped_lockable|guarded_by|pt_guarded_by|acquired_before|"
                         r"acquired_after|requires_capability|requires_shared_capability|"
                         r"acquire_capability|acquire_shared_capability|release_capability|"
                         r"release_shared_capability|try_acquire_capability|locks_excluded|"
                         r"assert_capability|lock_returned|no_thread_safety_analysis)\b")
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def expand_unity(entries: list[dict]) -> list[dict]:
    """Each CMake unity source (.../Unity/unity_N_cxx.cxx, one #include per batched file) as one
    entry per file it includes, with the batch's command; other entries as they are."""
    out = []
    for entry in entries:
        path = pathlib.Path(entry["directory"], entry["file"])
        if path.parent.name != "Unity" or not path.name.startswith("unity_"):
            out.append(entry)
            continue
        for included in _QUOTED_INCLUDE.findall(path.read_text()):
            out.append({**entry, "file": str(pathlib.Path(path.parent, included))})
    return out


class AnnotationScope:
    """Which src/ files see a thread-safety attribute: their own text or that of a project
    header they include, directly or through other project headers ("module/file.h" from src/,
    or a name next to the including file)."""

    def __init__(self, src: pathlib.Path):
        self._src = src
        self._files: dict[pathlib.Path, tuple[bool, list[pathlib.Path]]] = {}

    def _read(self, path: pathlib.Path) -> tuple[bool, list[pathlib.Path]]:
        """(whether `path` spells an attribute, the project files it includes)."""
        if path not in self._files:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                text = ""
            includes = []
            for name in _QUOTED_INCLUDE.findall(text):
                for candidate in (self._src / name, path.parent / name):
                    if candidate.is_file():
                        includes.append(candidate.resolve())
                        break
            self._files[path] = (bool(_ANNOTATION.search(text)), includes)
        return self._files[path]

    def sees_annotation(self, path: pathlib.Path) -> bool:
        pending, seen = [path.resolve()], set()
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            annotated, includes = self._read(current)
            if annotated:
                return True
            pending.extend(includes)
        return False


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
    check_all = False
    limits = []
    rest = argv[1:]
    while rest:
        if rest[0] == "--all":
            check_all = True
            rest = rest[1:]
        elif rest[0] in ("-j", "-b") and len(rest) > 1:
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
    entries = [e for e in expand_unity(json.loads(database.read_text()))
               if pathlib.Path(e["file"]).resolve().is_relative_to(src)
               and any(pathlib.Path(e["file"]).resolve().is_relative_to(p) for p in limits)]
    if not entries:
        print(f"check_thread_safety: no src/ file in {database}", file=sys.stderr)
        return 2
    skipped = 0
    if not check_all:
        scope = AnnotationScope(src)
        kept = [e for e in entries if scope.sees_annotation(pathlib.Path(e["file"]))]
        skipped = len(entries) - len(kept)
        entries = kept

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
          f"({seconds:.0f} s, -j {jobs}; {skipped} more see no annotation, --all checks them)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
