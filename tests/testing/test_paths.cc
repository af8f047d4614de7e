#include "testing/test_paths.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace pdserve::testing {

std::string SharedPath(const std::string& relative) {
  const char* env = std::getenv("PDSERVE_SHARED_DIR");
  std::string base = env != nullptr ? env : PDSERVE_SHARED_DIR;
  return base + "/" + relative;
}

bool SharedPathExists(const std::string& relative) {
  std::string path = SharedPath(relative);
  if (std::filesystem::exists(path)) return true;
  std::fprintf(stderr,
               "\n**********************************************************\n"
               "*** MISSING TEST DATA: %s\n"
               "*** (set PDSERVE_SHARED_DIR to the folder holding models/ and tokenizers/)\n"
               "**********************************************************\n\n",
               path.c_str());
  return false;
}

std::string BinaryPath(const std::string& relative) {
  return std::string(PDSERVE_BINARY_DIR) + "/" + relative;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/" + prefix + "XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  if (dir == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace pdserve::testing
