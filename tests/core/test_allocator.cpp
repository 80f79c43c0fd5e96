// The allocator of a program that links loom::kernels: jemalloc where the build found it
// (LOOM_MALLOC, cmake/loom_kernels.cmake), proven by asking jemalloc itself what this
// thread allocated; else the system's.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

// jemalloc's control interface: null (a weak reference) where jemalloc is not linked.
extern "C" int mallctl(const char* name, void* old_value, std::size_t* old_length, void* new_value,
                       std::size_t new_length) __attribute__((weak));

namespace {
// Keeps the compiler from pairing an allocation with its free and dropping both.
void* volatile allocator_sink = nullptr;
} // namespace

TEST_CASE("a program that links loom::kernels allocates with the allocator the build chose") {
#ifdef LOOM_MALLOC_JEMALLOC
  REQUIRE_MESSAGE(mallctl != nullptr,
                  "built with LOOM_MALLOC=jemalloc, but jemalloc's mallctl is not linked");
  const char* version = nullptr;
  std::size_t length = sizeof(version);
  REQUIRE(mallctl("version", &version, &length, nullptr, 0) == 0);
  MESSAGE("jemalloc " << std::string(version));
  // What this thread has allocated through jemalloc, as jemalloc counts it: malloc and
  // operator new (libstdc++'s, which calls malloc) must both add to it.
  std::uint64_t* allocated = nullptr;
  length = sizeof(allocated);
  REQUIRE(mallctl("thread.allocatedp", &allocated, &length, nullptr, 0) == 0);
  constexpr std::size_t block = std::size_t{1} << 20;
  const std::uint64_t before = *allocated;
  allocator_sink = std::malloc(block);
  std::free(allocator_sink);
  CHECK(*allocated - before >= block);
  const std::uint64_t after_malloc = *allocated;
  allocator_sink = ::operator new(block);
  ::operator delete(allocator_sink);
  CHECK(*allocated - after_malloc >= block);
#else
  MESSAGE("built with the system allocator (LOOM_MALLOC=system, a sanitizer, or no jemalloc)");
  CHECK(mallctl == nullptr);
#endif
}
