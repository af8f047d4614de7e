#include "kernels/dispatch.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/mutex.h"
#include "kernels/kernel_table.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pdserve::kernels {
namespace {

using internal::KernelTable;

#if defined(__x86_64__)
// The CPUID feature bits the paths need (Intel SDM vol. 2A, CPUID leaves 1 and 7), read
// directly: compilers differ in which names __builtin_cpu_supports knows (clang 14 has no
// "f16c").
struct CpuFeatures {
  bool fma, f16c, avx2, bmi2, avx512f, avx512dq, avx512bw, avx512vl, avx512bf16, avx512vnni;
  bool amx_tile, amx_bf16;
  uint64_t xcr0;  // the state the OS saves across context switches (0 without OSXSAVE)
};

CpuFeatures ReadCpuFeatures() {
  CpuFeatures f{};
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return f;
  f.fma = (ecx & (1u << 12)) != 0;
  f.f16c = (ecx & (1u << 29)) != 0;
  if ((ecx & bit_OSXSAVE) != 0) {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.xcr0 = (uint64_t{hi} << 32) | lo;
  }
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0) {
    f.avx2 = (ebx & (1u << 5)) != 0;
    f.bmi2 = (ebx & (1u << 8)) != 0;
    f.avx512f = (ebx & (1u << 16)) != 0;
    f.avx512dq = (ebx & (1u << 17)) != 0;
    f.avx512bw = (ebx & (1u << 30)) != 0;
    f.avx512vl = (ebx & (1u << 31)) != 0;
    f.avx512vnni = (ecx & (1u << 11)) != 0;
    f.amx_bf16 = (edx & (1u << 22)) != 0;
    f.amx_tile = (edx & (1u << 24)) != 0;
    const uint32_t max_subleaf = eax;
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) {
      f.avx512bf16 = (eax & (1u << 5)) != 0;
    }
  }
  return f;
}

// Linux gives a process the 8 KB of tile data state only on request (the kernel's
// Documentation/arch/x86/xstate.rst): arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
// The permission is the process's, so it is asked for once.
bool HaveAmxPermission() {
#if defined(__linux__)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
#else
  return false;
#endif
}
#endif

// A path whose BF16 products are AMX tile kernels (`products` fills name and packed_tile*) and
// whose other kernels are `base`'s.
KernelTable WithAmxProducts(const KernelTable& products, const KernelTable& base,
                            const char* name) {
  KernelTable table = base;
  table.name = name;
  table.packed_tile = products.packed_tile;
  table.packed_tile_tokens = products.packed_tile_tokens;
  return table;
}

std::vector<std::string_view> MissingFeatures(const KernelTable& path);

#if defined(__x86_64__)
const KernelTable& AmxPath() {
  static const KernelTable table =
      WithAmxProducts(internal::kAmxKernels, internal::kAvx512Kernels, "amx");
  return table;
}
#endif

// "amx-model": the products on the tile model, the rest from the best other path this CPU runs,
// which its name states ("amx-model+avx2"): that name is what the model fingerprint and the
// peers of a disaggregated deployment compare.
const KernelTable& AmxModelPath() {
  static const KernelTable table = [] {
#if defined(__x86_64__)
    if (MissingFeatures(internal::kAvx512Kernels).empty()) {
      return WithAmxProducts(internal::kAmxModelKernels, internal::kAvx512Kernels,
                             "amx-model+avx512");
    }
    if (MissingFeatures(internal::kAvx2Kernels).empty()) {
      return WithAmxProducts(internal::kAmxModelKernels, internal::kAvx2Kernels, "amx-model+avx2");
    }
#endif
    return WithAmxProducts(internal::kAmxModelKernels, internal::kGenericKernels,
                           "amx-model+generic");
  }();
  return table;
}

// The name that selects a path: its name up to a '+' ("amx-model+avx2" -> "amx-model").
std::string_view SelectionName(const KernelTable& path) {
  const std::string_view name = path.name;
  return name.substr(0, name.find('+'));
}

// The CPU features a path needs and this CPU lacks, as named in /proc/cpuinfo.
std::vector<std::string_view> MissingFeatures(const KernelTable& path) {
  std::vector<std::string_view> missing;
#if defined(__x86_64__)
  // The model path runs anywhere (its base was chosen among the paths this CPU runs). Told by
  // its products: AmxModelPath() itself asks this function while it is being built.
  if (&path == &internal::kGenericKernels ||
      path.packed_tile == internal::kAmxModelKernels.packed_tile) {
    return missing;
  }
  const CpuFeatures f = ReadCpuFeatures();
  // The OS must save the YMM (and for AVX-512 the opmask and ZMM) state across context
  // switches, or the instructions fault although CPUID lists them.
  if ((f.xcr0 & 0x6) != 0x6) missing.push_back("os-avx-state");
  if (!f.avx2) missing.push_back("avx2");
  if (!f.fma) missing.push_back("fma");
  if (!f.f16c) missing.push_back("f16c");
  const bool amx = &path == &AmxPath();
  if (&path == &internal::kAvx512Kernels || amx) {
    if ((f.xcr0 & 0xe6) != 0xe6) missing.push_back("os-avx512-state");
    if (!f.avx512f) missing.push_back("avx512f");
    if (!f.avx512bw) missing.push_back("avx512bw");
    if (!f.avx512vl) missing.push_back("avx512vl");
    if (!f.avx512dq) missing.push_back("avx512dq");
    if (!f.avx512bf16) missing.push_back("avx512_bf16");
    if (!f.avx512vnni) missing.push_back("avx512_vnni");
    if (!f.bmi2) missing.push_back("bmi2");
  }
  if (amx) {
    if (!f.amx_tile) missing.push_back("amx_tile");
    if (!f.amx_bf16) missing.push_back("amx_bf16");
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state.
    if ((f.xcr0 & 0x60000) != 0x60000) missing.push_back("os-amx-state");
    if (missing.empty() && !HaveAmxPermission()) missing.push_back("os-amx-permission");
  }
#else
  (void)path;
#endif
  return missing;
}

// Fastest first. "amx-model" is a development path (AMX's order of accumulation where no AMX
// is), never chosen by "auto"; it sits before generic, which stays last.
std::vector<const KernelTable*> AllPaths() {
#if defined(__x86_64__)
  return {&AmxPath(), &internal::kAvx512Kernels, &internal::kAvx2Kernels, &AmxModelPath(),
          &internal::kGenericKernels};
#else
  return {&AmxModelPath(), &internal::kGenericKernels};
#endif
}

std::string Join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// The selection is process-wide state by nature: the kernels are free functions called from
// everywhere, and the CPU they run on is one. The pointer is read on every kernel call; the
// mutex orders selections and guards the description.
std::atomic<const KernelTable*> g_active{nullptr};
Mutex g_mutex;
std::string g_how GUARDED_BY(g_mutex);

Status SelectLocked(std::string_view name, std::string how) REQUIRES(g_mutex) {
  const KernelTable* chosen = nullptr;
  if (name.empty() || name == "auto") {
    for (const KernelTable* p : AllPaths()) {
      if (p != &AmxModelPath() && MissingFeatures(*p).empty()) {
        chosen = p;
        break;
      }
    }
  } else {
    for (const KernelTable* p : AllPaths()) {
      if (name == p->name || name == SelectionName(*p)) chosen = p;
    }
    if (chosen == nullptr) {
      return Status::InvalidArgument("unknown kernel path '" + std::string(name) +
                                     "' (known: " + Join(KnownPaths()) + ")");
    }
    if (auto missing = MissingFeatures(*chosen); !missing.empty()) {
      return Status::FailedPrecondition("kernel path '" + std::string(name) +
                                        "' cannot run on this CPU: it lacks " + Join(missing) +
                                        " (supported: " + Join(SupportedPaths()) + ")");
    }
  }
  g_how = std::move(how);
  g_active.store(chosen, std::memory_order_release);
  return Status::Ok();
}

std::string EnvironmentChoice() {
  const char* env = std::getenv("PDSERVE_KERNELS");
  return env == nullptr ? std::string() : std::string(env);
}

std::string HowFromName(std::string_view name, bool from_env) {
  if (name.empty() || name == "auto") return "auto: best of " + Join(SupportedPaths());
  return (from_env ? "PDSERVE_KERNELS=" : "selected ") + std::string(name) + "; CPU supports " +
         Join(SupportedPaths());
}

}  // namespace

std::vector<std::string_view> KnownPaths() {
  std::vector<std::string_view> names;
  for (const KernelTable* p : AllPaths()) names.emplace_back(SelectionName(*p));
  return names;
}

std::vector<std::string_view> SupportedPaths() {
  std::vector<std::string_view> names;
  for (const KernelTable* p : AllPaths()) {
    if (MissingFeatures(*p).empty()) names.emplace_back(SelectionName(*p));
  }
  return names;
}

std::string_view ActivePath() { return internal::Active().name; }

std::string ArithmeticIdentity() {
  return std::string(ActivePath()) + " r" + std::to_string(kArithmeticRevision);
}

Status SelectPath(std::string_view name) {
  MutexLock lock(&g_mutex);
  return SelectLocked(name, HowFromName(name, false));
}

Status SelectPathFromEnvironment() {
  const std::string name = EnvironmentChoice();
  MutexLock lock(&g_mutex);
  Status s = SelectLocked(name, HowFromName(name, true));
  if (!s.ok()) return Status(s.code(), "PDSERVE_KERNELS: " + s.message());
  return s;
}

std::string DescribeSelection() {
  const std::string_view name = ActivePath();
  MutexLock lock(&g_mutex);
  return std::string(name) + " (" + g_how + ")";
}

namespace internal {

const KernelTable& Active() {
  const KernelTable* table = g_active.load(std::memory_order_acquire);
  if (table != nullptr) return *table;
  MutexLock lock(&g_mutex);
  if (g_active.load(std::memory_order_relaxed) == nullptr) {
    // Nobody selected: honour PDSERVE_KERNELS if it names a path this CPU runs, else the best.
    // (The CLI selects explicitly at start-up and fails on a bad value; library users that
    // never select must not crash on one.)
    const std::string name = EnvironmentChoice();
    if (!SelectLocked(name, HowFromName(name, true)).ok()) {
      (void)SelectLocked("auto", HowFromName("auto", false));
    }
  }
  return *g_active.load(std::memory_order_acquire);
}

}  // namespace internal
}  // namespace pdserve::kernels
