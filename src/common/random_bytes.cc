#include "common/random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <string>

namespace pdserve {

Status FillRandomBytes(std::span<uint8_t> out, const char* what) {
  size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t n = getrandom(out.data() + filled, out.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(std::string("getrandom for ") + what, errno);
    }
    filled += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace pdserve
