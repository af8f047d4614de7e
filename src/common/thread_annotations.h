// Clang thread-safety annotations (-Wthread-safety): which mutex guards which member, and which
// mutexes a function needs held or not held. They compile to nothing under other compilers
// (GCC builds the project; clang checks it: `make thread-safety`). Use them with the annotated
// Mutex / SharedMutex of common/mutex.h; libstdc++'s std::mutex carries no annotations.
// Macros only: usable from any file, no run-time effect.
#pragma once

#if defined(__clang__)
#define PD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PD_THREAD_ANNOTATION(x)
#endif

// On a class: its objects are capabilities (mutexes) named `x` in diagnostics.
#define CAPABILITY(x) PD_THREAD_ANNOTATION(capability(x))
// On an RAII class that acquires a capability in its constructor and releases it on destruction.
#define SCOPED_CAPABILITY PD_THREAD_ANNOTATION(scoped_lockable)
// On a data member: read or written only while holding `x`.
#define GUARDED_BY(x) PD_THREAD_ANNOTATION(guarded_by(x))
// On a pointer member: the pointee is accessed only while holding `x`.
#define PT_GUARDED_BY(x) PD_THREAD_ANNOTATION(pt_guarded_by(x))
// On a mutex member: when both are taken, this one is taken before/after the listed ones.
#define ACQUIRED_BEFORE(...) PD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) PD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// On a function: the caller must hold the capabilities (exclusively / at least shared).
#define REQUIRES(...) PD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) PD_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// On a function: it acquires / releases the capabilities (no argument: `this`).
#define ACQUIRE(...) PD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) PD_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) PD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) PD_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) PD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: the caller must NOT hold the capabilities (it takes them itself).
#define EXCLUDES(...) PD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: asserts (to the analysis) that the calling thread holds the capability.
#define ASSERT_CAPABILITY(x) PD_THREAD_ANNOTATION(assert_capability(x))
// On a getter: it returns the capability `x` (lets callers name a private mutex).
#define RETURN_CAPABILITY(x) PD_THREAD_ANNOTATION(lock_returned(x))
// On a function whose locking the analysis cannot follow; say why next to each use.
#define NO_THREAD_SAFETY_ANALYSIS PD_THREAD_ANNOTATION(no_thread_safety_analysis)
