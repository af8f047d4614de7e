// PD_CHECK: aborts on a broken invariant (a programmer error), never on bad input.
// Bad input from outside must become a Status instead. Safe from any thread.
#pragma once

#include <cstdio>
#include <cstdlib>

#define PD_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define PD_CHECK_MSG(cond, msg)                                                               \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
