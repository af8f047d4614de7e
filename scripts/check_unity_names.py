#!/usr/bin/env python3
"""Checks that the files compiled together in one unity source share no file-local name.

Usage: scripts/check_unity_names.py [-b BUILD_DIR]   (default: build)

With PDSERVE_UNITY_BUILD each opted-in target compiles as one translation unit (CMake's
Unity/unity_N_cxx.cxx under BUILD_DIR, found through its compile_commands.json). A function,
constant or type that one file keeps to itself (in an anonymous namespace, or `static`) is then
visible to the files after it. The same name defined in two files is at best a redefinition
error; at worst it compiles and a later file's call resolves to the other file's function (a
file-local Median(std::vector<double>) of one file hid bench::Median of another, which handles
an empty vector, and a test crashed). So this fails when a file-local name of one file is also
defined, at namespace scope, in another file of the same unity source, naming both.

It reads the source text (definitions start at column 0, anonymous namespaces close with
`}  // namespace`, as clang-format writes them); exit 1 on a shared name, 0 when none (or no
unity source), 2 when the compile database is missing. Standard library only.
"""

import json
import pathlib
import re
import sys

_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
# A function, constant or type defined (or declared) at namespace scope, starting at column 0.
_FUNCTION = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:(?:static|inline|constexpr|\[\[nodiscard\]\])"
                       r"\s+)*[\w:<>,*&]+(?:[\s*&]+[\w:<>,*&]+)*?[\s*&]+(\w+)\s*\(")
_CONSTANT = re.compile(r"^(?:static\s+|inline\s+)*(?:constexpr|const)\b[^=;(]*?\b(k[A-Z]\w*)\b")
_TYPE = re.compile(r"^(?:class|struct|enum(?:\s+class)?|union)\s+(\w+)\b(?!;)")
_NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "operator"}


def definitions(text: str) -> list[tuple[str, int, bool]]:
    """(name, line, file-local) of each namespace-scope definition that starts at column 0."""
    out = []
    anonymous = 0  # depth of `namespace {` blocks open at this line
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("namespace {"):
            anonymous += 1
            continue
        if line.startswith("}  // namespace") and not line.startswith("}  // namespace ") and anonymous:
            anonymous -= 1
            continue
        if not line or line[0].isspace() or line.startswith(("#", "//", "}", "using ")):
            continue
        for pattern in (_TYPE, _CONSTANT, _FUNCTION):
            match = pattern.match(line)
            if match and match.group(1) not in _NOT_NAMES and "::" + match.group(1) not in line:
                out.append((match.group(1), number, anonymous > 0 or line.startswith("static ")))
                break
    return out


def unity_sources(build: pathlib.Path) -> list[list[pathlib.Path]]:
    """The files of each unity source in BUILD's compile database, in their order."""
    groups = []
    for entry in json.loads((build / "compile_commands.json").read_text()):
        path = pathlib.Path(entry["directory"], entry["file"])
        if path.parent.name == "Unity" and path.name.startswith("unity_"):
            groups.append([pathlib.Path(path.parent, name)
                           for name in _QUOTED_INCLUDE.findall(path.read_text())])
    return groups


def shared_names(files: list[pathlib.Path]) -> list[str]:
    """One message per file-local name that another file of the group also defines."""
    places: dict[str, list[tuple[pathlib.Path, int, bool]]] = {}
    for path in files:
        for name, line, local in definitions(path.read_text(errors="replace")):
            places.setdefault(name, []).append((path, line, local))
    messages = []
    for name, where in places.items():
        if len({path for path, _, _ in where}) > 1 and any(local for _, _, local in where):
            listed = ", ".join(f"{path}:{line}{' (file-local)' if local else ''}"
                               for path, line, local in where)
            messages.append(f"'{name}' is defined in {listed}, compiled as one unity source: "
                            "rename the file-local one (a call in a later file may resolve to it)")
    return messages


def main(argv: list[str]) -> int:
    build = pathlib.Path("build")
    if len(argv) == 3 and argv[1] == "-b":
        build = pathlib.Path(argv[2])
    elif len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if not (build / "compile_commands.json").is_file():
        print(f"check_unity_names: {build}/compile_commands.json is missing", file=sys.stderr)
        return 2
    groups = unity_sources(build)
    messages = [m for files in groups for m in shared_names(files)]
    for message in messages:
        print(message)
    if messages:
        print(f"check_unity_names: {len(messages)} file-local name(s) shared in a unity source",
              file=sys.stderr)
        return 1
    print(f"check_unity_names: {len(groups)} unity sources, no file-local name shared")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
