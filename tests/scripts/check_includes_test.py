#!/usr/bin/env python3
"""Tests scripts/check_includes.py: the real src/ passes; forbidden includes injected into a copy
of a few real files fail, and the report names each file, line and broken rule."""

import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
CHECKER = ROOT / "scripts" / "check_includes.py"


def run_checker(src: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), str(src)], capture_output=True,
                          text=True, timeout=60, check=False)


class CheckIncludesTest(unittest.TestCase):
    def test_real_tree_follows_the_table(self):
        result = run_checker(ROOT / "src")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_injected_upward_includes_fail_and_are_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "src"
            # Real files, copied; each then gains one include its module may not use.
            for rel in ("kv/page_pool.h", "server/metrics.h", "engine/engine.h",
                        "common/status.h"):
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / "src" / rel, src / rel)
            clean = run_checker(src)
            self.assertEqual(clean.returncode, 0, clean.stdout + clean.stderr)

            def inject(rel: str, include: str) -> int:
                path = src / rel
                lines = path.read_text().splitlines(keepends=True)
                at = next(i for i, line in enumerate(lines) if line.startswith("#include"))
                lines.insert(at, f'#include "{include}"\n')
                path.write_text("".join(lines))
                return at + 1  # 1-based line of the injected include

            kv_line = inject("kv/page_pool.h", "engine/engine.h")
            server_line = inject("server/metrics.h", "model/transformer.h")
            result = run_checker(src)
            print(result.stdout + result.stderr)  # the issue quotes this output
            self.assertEqual(result.returncode, 1)
            self.assertIn(f"kv/page_pool.h:{kv_line}: kv/ may not include engine/", result.stdout)
            self.assertIn(f"server/metrics.h:{server_line}: server/ may not include model/",
                          result.stdout)
            self.assertEqual(len(result.stdout.splitlines()), 2, result.stdout)

    def test_cli_reaches_the_messenger_through_server_and_the_router_only_from_its_commands(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "src"
            (src / "cli").mkdir(parents=True)
            # The router's commands may include router/; any other cli file may not, and no
            # cli file may include messenger/.
            (src / "cli" / "up.cc").write_text('#include "router/router.h"\n')
            (src / "cli" / "router.cc").write_text('#include "router/router.h"\n')
            self.assertEqual(run_checker(src).returncode, 0)
            (src / "cli" / "serve.cc").write_text(
                '#include "server/role_front.h"\n#include "messenger/decode_messenger.h"\n'
                '#include "router/router_nodes.h"\n')
            (src / "cli" / "up.cc").write_text(
                '#include "router/router.h"\n#include "messenger/cluster_proof.h"\n')
            result = run_checker(src)
            print(result.stdout + result.stderr)  # the issue quotes this output
            self.assertEqual(result.returncode, 1)
            self.assertIn("cli/serve.cc:2: cli/ may not include messenger/", result.stdout)
            self.assertIn("cli/serve.cc:3: cli/ may not include router/", result.stdout)
            self.assertIn("cli/up.cc:2: cli/ may not include messenger/", result.stdout)
            self.assertEqual(len(result.stdout.splitlines()), 3, result.stdout)

    def test_module_may_include_itself_and_third_party_paths(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "src"
            (src / "kv").mkdir(parents=True)
            (src / "kv" / "a.cc").write_text(
                '#include "kv/a.h"\n#include "common/status.h"\n#include "oneapi/dnnl/dnnl.hpp"\n')
            self.assertEqual(run_checker(src).returncode, 0)

    def test_unknown_module_folder_fails(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "src"
            (src / "newmod").mkdir(parents=True)
            (src / "newmod" / "a.h").write_text("#pragma once\n")
            result = run_checker(src)
            self.assertEqual(result.returncode, 1)
            self.assertIn("newmod", result.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
