// The allocator of a program that links loom::kernels: jemalloc where the build found it
// (LOOM_MALLOC, cmake/loom_kernels.cmake), proven by asking jemalloc itself what this
// thread allocated, and with loom's setting of it (transparent huge pages); else the
// system's.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

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
  // loom's setting (loom_kernels.cpp's malloc_conf) took effect: transparent huge pages for
  // jemalloc's memory, unless the environment's MALLOC_CONF says otherwise.
  const char* thp = nullptr;
  length = sizeof(thp);
  REQUIRE(mallctl("opt.thp", &thp, &length, nullptr, 0) == 0);
  const char* env = std::getenv("MALLOC_CONF");
  if (env != nullptr && std::string_view(env).find("thp") != std::string_view::npos)
    MESSAGE("MALLOC_CONF=" << env << " chooses jemalloc's thp: opt.thp is " << thp);
  else
    CHECK(std::string_view(thp) == "always");
#else
  MESSAGE("built with the system allocator (LOOM_MALLOC=system, a sanitizer, or no jemalloc)");
  CHECK(mallctl == nullptr);
#endif
}
