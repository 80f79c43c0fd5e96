// any_tensor alone: the value every kernel, the executor and the wire pass
// around. Copies share a buffer (TF's Tensor), sole_owner says when a writer
// may write in place, clone makes the copy a copy-on-write update writes,
// every buffer is 64-byte aligned (Eigen's aligned maps rely on it), and a
// misuse is one clear error.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/core/tensor.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using loom::any_tensor;
using loom::dtype;
using loom::shape;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

bool aligned64(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}

any_tensor filled(shape s, float v) {
  any_tensor t(dtype::f32, std::move(s));
  for (float& x : t.flat<float>())
    x = v;
  return t;
}

} // namespace

TEST_CASE("any_tensor: copies share the buffer, clone does not") {
  any_tensor a = filled(shape{2, 3}, 1.f);
  any_tensor b = a;
  CHECK(a.shares_buffer_with(b));
  b.data<float>()[4] = 7.f; // a write through one copy is seen through the other
  CHECK(a.data<float>()[4] == 7.f);

  any_tensor c = a.clone();
  CHECK_FALSE(c.shares_buffer_with(a));
  CHECK(c.shape() == a.shape());
  CHECK(c.type() == dtype::f32);
  c.data<float>()[4] = -1.f;
  CHECK(a.data<float>()[4] == 7.f);

  any_tensor r = a.reshaped(shape{3, 2}); // the same buffer under another shape
  CHECK(r.shares_buffer_with(a));
  CHECK(r.shape() == shape{3, 2});
  CHECK(r.data<float>()[4] == 7.f);
}

TEST_CASE("any_tensor: strings are constructed, copied deeply by clone, and shared by copies") {
  any_tensor s(dtype::string, shape{3});
  for (const std::string& x : s.flat<std::string>())
    CHECK(x.empty());
  s.data<std::string>()[1] = std::string(100, 'x'); // past any small-string buffer
  any_tensor shared = s;
  any_tensor deep = s.clone();
  s.data<std::string>()[1] = "changed";
  CHECK(shared.data<std::string>()[1] == "changed");
  CHECK(deep.data<std::string>()[1] == std::string(100, 'x'));
}

TEST_CASE("any_tensor: sole_owner is true only while nothing else holds the buffer") {
  any_tensor a = filled(shape{4}, 2.f);
  CHECK(a.sole_owner());
  {
    any_tensor reader = a;
    CHECK_FALSE(a.sole_owner());
    CHECK_FALSE(reader.sole_owner());
    any_tensor view = a.reshaped(shape{2, 2});
    CHECK_FALSE(a.sole_owner());
  }
  CHECK(a.sole_owner());

  // The copy-on-write an update does (kernels/checks/training.hpp unshare_refs):
  // a buffer something else holds is cloned, and the writer writes the clone.
  any_tensor variable = a;
  any_tensor read_earlier = variable;
  if (!variable.sole_owner())
    variable = variable.clone();
  CHECK(variable.sole_owner());
  variable.data<float>()[0] = 5.f;
  CHECK(read_earlier.data<float>()[0] == 2.f);
  CHECK(variable.data<float>()[0] == 5.f);

  // A holder that lets go on another thread makes the writer the sole owner.
  any_tensor held = filled(shape{8}, 3.f);
  any_tensor other = held;
  std::thread t([o = std::move(other)]() mutable { o = {}; });
  t.join();
  CHECK(held.sole_owner());
}

TEST_CASE("any_tensor: every buffer is 64-byte aligned, small and large, new and reused") {
  std::vector<any_tensor> keep;
  for (const std::int64_t n : {1, 3, 17, 1000, 70000, 1 << 20}) {
    for (const dtype d : {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::boolean}) {
      CAPTURE(n);
      any_tensor t(d, shape{n});
      CHECK(aligned64(t.raw_data()));
      keep.push_back(t);
    }
  }
  // A large block released is kept for the next tensor of that size; still aligned.
  const void* released = nullptr;
  {
    any_tensor big(dtype::f32, shape{1 << 18});
    released = big.raw_data();
  }
  any_tensor again(dtype::f32, shape{1 << 18});
  CHECK(aligned64(again.raw_data()));
  CHECK(again.raw_data() == released);
}

namespace {
// The VmFlags of the mapping that holds `p` (/proc/self/smaps), "" where none does.
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t first = 0, last = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> first >> dash >> last && dash == '-' &&
        line.find(':') > line.find(' ')) // a mapping's header, not a "Key: value" line
      inside = first <= at && at < last;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}
} // namespace

TEST_CASE("any_tensor: a buffer of 2 MiB or more starts on a huge page and is marked for them") {
  // A ps's tables: random rows of hundreds of MB, where 4 KiB pages made nearly every row a
  // TLB miss (core/block_cache.hpp).
  REQUIRE_MESSAGE(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good(),
                  "this kernel has no transparent huge pages (no "
                  "/sys/kernel/mm/transparent_hugepage/enabled)");
  any_tensor table(dtype::f32, shape{1 << 20, 4}); // 16 MiB
  CHECK(reinterpret_cast<std::uintptr_t>(table.raw_data()) % (2u << 20) == 0);
  const std::string flags = mapping_flags(table.raw_data());
  CAPTURE(flags);
  CHECK(contains(flags, " hg")); // madvise(MADV_HUGEPAGE)
  // A small one keeps the allocator's pages: huge pages for every block would grow a
  // server's memory in 2 MiB steps per connection.
  any_tensor small(dtype::f32, shape{1000});
  CHECK_FALSE(contains(mapping_flags(small.raw_data()), " hg"));
  // Nor a tensor a peer's bytes fill: a 16 MiB one a peer declared commits a 4 KiB page
  // per page it sent, not 2 MiB.
  any_tensor received = any_tensor::for_peer_bytes(dtype::f32, shape{1 << 20, 4});
  CHECK_FALSE(contains(mapping_flags(received.raw_data()), " hg"));
}

TEST_CASE("any_tensor: empty and scalar tensors") {
  any_tensor none;
  CHECK(none.empty());
  CHECK(none.num_elements() == 0);
  CHECK(none.clone().empty());
  CHECK_FALSE(none.shares_buffer_with(any_tensor{}));

  any_tensor zero(dtype::f32, shape{0, 5});
  CHECK(zero.num_elements() == 0);
  CHECK(zero.clone().shape() == shape{0, 5});

  any_tensor s = any_tensor::scalar(2.5);
  CHECK(s.rank() == 0);
  CHECK(s.type() == dtype::f64);
  CHECK(s.data<double>()[0] == 2.5);
  CHECK(s.describe() == "float64[]");
}

TEST_CASE("any_tensor: a misuse is one error that says what and where") {
  any_tensor a = filled(shape{2, 3}, 0.f);
  const std::string reshape = message_of<loom::invalid_argument_error>([&] {
    (void)a.reshaped(shape{4, 2});
  });
  CHECK(contains(reshape, "cannot reshape a tensor of shape [2, 3] (6 elements) to [4, 2]"));
  const std::string typed =
      message_of<loom::invalid_argument_error>([&] { (void)a.data<std::int32_t>(); });
  CHECK(contains(typed, "tensor holds float32, accessed as int32"));
  const std::string from = message_of<loom::invalid_argument_error>([] {
    (void)any_tensor::from_vector(shape{2, 2}, std::vector<float>{1.f, 2.f, 3.f});
  });
  CHECK(contains(from, "tensor of shape [2, 2] needs 4 values, got 3"));
}
