// The memory of host tensors (detail::buffer, core/tensor.hpp): 64-byte-aligned
// blocks that released tensors leave for the next tensor of about their size,
// TF's BFC allocator's role. A step allocates and frees the same sizes every
// time; glibc serves an aligned request on its slow path (memalign: no
// per-thread cache, a split and a consolidation), which was 11.5 % of an
// examples/ctr worker's CPU and 10.6 % of its ps's.
//
// Blocks of 2 MiB or more (embedding tables, large variables) start on a 2 MiB
// boundary and are marked for transparent huge pages (madvise, Linux): a ps's
// gathers and sparse updates touch random rows of tables of hundreds of MB, and
// with 4 KiB pages nearly every row was a TLB miss beside its cache miss. Where
// the system's THP setting is "madvise" (Debian's default) only memory so marked
// gets huge pages; where it is "never" the mark does nothing. Smaller blocks
// are not marked, nor the blocks of bytes a peer sends (pages::small): a peer
// that declares a large tensor and sends a few bytes of it would otherwise
// commit a 2 MiB page where it committed 4 KiB (a server under hostile
// connections: 48-58 MiB resident instead of 8-11; jemalloc's thp:always for
// every block: 146-152 MiB).
#pragma once

#include <loom/core/compiled_once.hpp>

#include <bit>
#include <cstddef>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// g++ says AddressSanitizer with __SANITIZE_ADDRESS__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_BLOCK_CACHE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_BLOCK_CACHE_UNDER_ASAN 1
#endif
#endif
#ifndef LOOM_BLOCK_CACHE_UNDER_ASAN
#define LOOM_BLOCK_CACHE_UNDER_ASAN 0
#endif

namespace loom::detail {

// The pages a block may have: huge ones where it is large enough, or the small
// ones only (memory a peer's bytes fill).
enum class pages { huge_where_large, small };

// Large blocks (at least large_bytes) are kept by their exact size: a ps that
// takes a 64 MB assign or sends a 64 MB variable every step would otherwise
// pay a fresh mapping each time (an mmap, 16384 page faults, an munmap: on
// loopback about as long as moving the bytes). Smaller ones are made in size
// classes, four per power of two (at most 25 % over the size asked for), and
// a released block waits for the next request of its class. At most
// max_idle_bytes of large and max_idle_small_bytes of small blocks wait; the
// rest goes back to malloc. A block is handed out only when no tensor holds
// it: release() is called by the last owner (a buffer's destructor).
//
// Under AddressSanitizer nothing is kept, so a use after free is still caught.
class block_cache {
public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t huge_page_bytes = 2u << 20;
  static constexpr std::size_t large_bytes = 256u << 10;
  static constexpr std::size_t max_idle_bytes = 512u << 20;
  static constexpr std::size_t max_idle_small_bytes = 64u << 20;
  static constexpr bool keeps_blocks = !LOOM_BLOCK_CACHE_UNDER_ASAN;

  // Never destroyed: tensors in other static objects may outlive any order.
  static block_cache& instance() {
    static block_cache* c = new block_cache;
    return *c;
  }

  // The size of the block a request of `bytes` gets: its class's size below large_bytes.
  static std::size_t block_bytes(std::size_t bytes) noexcept {
    return bytes >= large_bytes ? bytes : class_bytes(size_class(bytes));
  }

  void* allocate(std::size_t bytes, pages kind = pages::huge_where_large);

  // Takes back a block allocate(bytes, kind) returned.
  void release(void* p, std::size_t bytes, pages kind = pages::huge_where_large) noexcept;

  // The alignment of a block: a huge page's where it may have huge pages.
  static constexpr std::size_t alignment_of(std::size_t bytes, pages kind) noexcept {
    return bytes >= huge_page_bytes && kind == pages::huge_where_large ? huge_page_bytes
                                                                       : alignment;
  }

private:
  // Before the block is first written, so that its page faults map huge pages.
  // Advice only: a kernel without THP refuses it and the block keeps small pages.
  static void advise_huge_pages([[maybe_unused]] void* p,
                                [[maybe_unused]] std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    ::madvise(p, bytes, MADV_HUGEPAGE);
#endif
  }

  // Classes 0 (up to 64 bytes), then four per power of two: class 1 + 4 (m - 6) + s
  // holds (5 + s) << (m - 2) bytes, for sizes above (4 + s) << (m - 2).
  static constexpr std::size_t classes = 1 + 4 * (std::bit_width(large_bytes - 1) - 6);
  static std::size_t size_class(std::size_t bytes) noexcept;
  static std::size_t class_bytes(std::size_t c) noexcept;

  std::mutex mu_;
  std::multimap<std::pair<std::size_t, pages>, void*> idle_; // by size and kind of pages
  std::size_t idle_bytes_ = 0;
  std::vector<void*> small_[classes];
  std::size_t idle_small_bytes_ = 0;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE auto block_cache::allocate(std::size_t bytes, pages kind) -> void* {
  if (keeps_blocks && bytes < large_bytes) {
    const std::size_t c = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      if (auto& idle = small_[c]; !idle.empty()) {
        void* p = idle.back();
        idle.pop_back();
        idle_small_bytes_ -= class_bytes(c);
        return p;
      }
    }
    return ::operator new (class_bytes(c), std::align_val_t{alignment});
  }
  if (keeps_blocks) {
    std::lock_guard lock(mu_);
    if (auto it = idle_.find({bytes, kind}); it != idle_.end()) {
      void* p = it->second;
      idle_.erase(it);
      idle_bytes_ -= bytes;
      return p;
    }
  }
  void* p = ::operator new (bytes, std::align_val_t{alignment_of(bytes, kind)});
  if (bytes >= huge_page_bytes && kind == pages::huge_where_large)
    advise_huge_pages(p, bytes);
  return p;
}

LOOM_COMPILED_ONCE void block_cache::release(void* p, std::size_t bytes, pages kind) noexcept {
  if (keeps_blocks && bytes < large_bytes) {
    const std::size_t c = size_class(bytes);
    std::lock_guard lock(mu_);
    if (idle_small_bytes_ + class_bytes(c) <= max_idle_small_bytes) {
      try {
        small_[c].push_back(p);
        idle_small_bytes_ += class_bytes(c);
        return;
      } catch (...) { // no memory for the list: free the block instead
      }
    }
  } else if (keeps_blocks) {
    std::lock_guard lock(mu_);
    if (idle_bytes_ + bytes <= max_idle_bytes) {
      try {
        idle_.emplace(std::pair{bytes, kind}, p);
        idle_bytes_ += bytes;
        return;
      } catch (...) {
      }
    }
  }
  ::operator delete (p, std::align_val_t{alignment_of(bytes, kind)});
}

LOOM_COMPILED_ONCE std::size_t block_cache::size_class(std::size_t bytes) noexcept {
  if (bytes <= 64)
    return 0;
  const std::size_t b = bytes - 1;
  const std::size_t m = static_cast<std::size_t>(std::bit_width(b)) - 1; // >= 6
  return 1 + 4 * (m - 6) + ((b >> (m - 2)) & 3);
}

LOOM_COMPILED_ONCE std::size_t block_cache::class_bytes(std::size_t c) noexcept {
  if (c == 0)
    return 64;
  const std::size_t m = (c - 1) / 4 + 6, s = (c - 1) % 4;
  return (5 + s) << (m - 2);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
