// Which kernel path runs the functions of kernels.h: "amx" (the BF16 products on AMX tiles, the
// rest as avx512), "avx512" (AVX-512 with BF16 dot products), "avx2" (AVX2 + FMA + F16C,
// x86-64-v3) or "generic" (plain C++, any CPU); and "amx-model", the AMX products on a software
// model of the tiles with the other kernels of the best other path the CPU runs (ActivePath
// names that one too: "amx-model+avx2"), which is never chosen unless named. The best path the
// CPU (and OS) supports is chosen on the first kernel call, unless PDSERVE_KERNELS or
// SelectPath names one. Every path is batch-invariant by itself; different paths may differ in
// the last bits (see kernels.h), so a KV cache is only reusable by the path that wrote it.
//
// Select before kernels run: call SelectPath / SelectPathFromEnvironment from main() or a test
// while no kernel is running on another thread. ActivePath and SupportedPaths are safe from any
// thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::kernels {

// Every path name this build knows, fastest first ("amx-model" just before "generic").
std::vector<std::string_view> KnownPaths();
// The paths this CPU can run, in the same order ("amx-model" and "generic" always).
std::vector<std::string_view> SupportedPaths();
// The path the kernels run on now (selecting the default on first use): the selection name,
// extended with the base path for "amx-model" ("amx-model+avx2").
std::string_view ActivePath();

// The revision of the kernels' arithmetic: raised whenever a path computes other bits for the
// same inputs, so that nodes built before and after (whose tokens would differ) refuse to pair.
// Revision 2: attention over a BF16 cache takes BF16 dot products (kernel_table.h).
// Revision 3: INT8 products quantise x per row and k block and take integer dot products.
inline constexpr int kArithmeticRevision = 3;
// What two nodes that exchange KV compare: the active path and the revision, "avx512 r3".
std::string ArithmeticIdentity();

// Makes `name` the active path. "auto" or "" selects the best supported path. Errors:
// InvalidArgument for an unknown name, FailedPrecondition naming the CPU features missing
// for a path this CPU cannot run.
Status SelectPath(std::string_view name);
// SelectPath(getenv("PDSERVE_KERNELS")), "auto" when unset; an error names the variable.
Status SelectPathFromEnvironment();
// One line for start-up logs: "avx2 (auto: best this CPU supports of avx2, generic)" or
// "generic (PDSERVE_KERNELS=generic; CPU supports avx2, generic)".
std::string DescribeSelection();

}  // namespace pdserve::kernels
