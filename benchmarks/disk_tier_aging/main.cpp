// A hash table's disk tier letting go of its aged rows (steps_to_live), on a tier of N rows
// where each lookup ages the rows of one earlier lookup (1 000 rows): through the tier's
// age order, as each lookup now does (kernels/cpu/row_file.hpp), against a pass over the
// tier's whole index that finds them, as a sweep did once every steps_to_live / 2 lookups
// before (the baseline, on the same tier in the same run). Both let the same rows go and
// put as many back, so the tier keeps N rows; only the letting go is timed. The shard's
// lock is held for that time: every lookup of the shard waits for it.
//
//   disk_tier_aging [--rows N] [--reps R] [--smoke]     N defaults to 2 000 000
#include "../bench_util.hpp"

#include <loom/kernels/cpu/row_file.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t rows_per_lookup = 1000;

} // namespace

int main(int argc, char** argv) {
  std::int64_t rows = 2'000'000;
  int reps = 15;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      rows = std::atoll(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--smoke") {
      rows = 20 * rows_per_lookup;
      reps = 1;
    } else {
      std::fprintf(stderr, "usage: disk_tier_aging [--rows N] [--reps R] [--smoke]\n");
      return 2;
    }
  }
  if (rows < rows_per_lookup || reps < 1) {
    std::fprintf(stderr, "disk_tier_aging: --rows must be at least %lld, --reps at least 1\n",
                 static_cast<long long>(rows_per_lookup));
    return 2;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom-disk-tier-aging-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct cleanup {
    std::filesystem::path dir;
    ~cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove_dir{dir};

  // A row's payload as examples/ctr's (dimension 64 and Adagrad's slot, floats).
  const std::vector<float> payload(2 * 64, 0.5f);
  loom::kernels::row_file tier((dir / "t.rows").string(), payload.size() * sizeof(float));
  // Row i was last looked up at lookup i / rows_per_lookup: the oldest lookup's rows age
  // first, then the next's. Ids are spread as a hash table's are.
  std::int64_t next_id = 0;
  const auto id_of = [](std::int64_t i) {
    return static_cast<std::int64_t>((static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL) >> 2);
  };
  for (; next_id < rows; ++next_id)
    tier.put(id_of(next_id), next_id / rows_per_lookup, payload.data());
  std::int64_t newest = (rows - 1) / rows_per_lookup;
  std::int64_t oldest = 0; // the lookup whose rows age next

  // The rows aged by now back in as the newest lookup's, so the tier keeps its size.
  const auto refill = [&](std::size_t n) {
    ++newest;
    for (std::size_t k = 0; k < n; ++k)
      tier.put(id_of(next_id++), newest, payload.data());
  };
  std::size_t aged_by_pass = 0, aged_by_order = 0;
  std::vector<double> pass_s, order_s;
  for (int r = 0; r < reps; ++r) {
    {
      std::vector<std::int64_t> aged;
      const double s = loom::bench::seconds_of([&] {
        tier.for_each([&](std::int64_t id, const loom::kernels::row_file::entry& e) {
          if (e.last_lookup <= oldest)
            aged.push_back(id);
        });
        for (std::int64_t id : aged)
          tier.erase(id);
      });
      pass_s.push_back(s);
      aged_by_pass += aged.size();
      ++oldest;
      refill(aged.size());
    }
    {
      std::vector<std::int64_t> aged;
      const double s = loom::bench::seconds_of([&] { aged = tier.erase_aged(oldest); });
      order_s.push_back(s);
      aged_by_order += aged.size();
      ++oldest;
      refill(aged.size());
    }
  }
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double pass = median(pass_s), order = median(order_s);
  std::printf("disk tier of %lld rows (%lld bytes of file), %lld rows aged a lookup, %d rounds "
              "alternated\n",
              static_cast<long long>(tier.rows()), static_cast<long long>(tier.bytes()),
              static_cast<long long>(rows_per_lookup), reps);
  std::printf("  a pass over the index (a sweep, before): %10.3f ms (%zu rows let go)\n",
              pass * 1e3, aged_by_pass);
  std::printf("  one lookup's rows through the age order:  %10.3f ms (%zu rows let go)\n",
              order * 1e3, aged_by_order);
  std::printf("  the age order's time / the pass's: %.4f\n", order / pass);
  const auto expected = static_cast<std::size_t>(reps) * static_cast<std::size_t>(rows_per_lookup);
  if (aged_by_pass != expected || aged_by_order != expected) {
    std::fprintf(stderr, "disk_tier_aging: the two let different rows go\n");
    return 1;
  }
  return 0;
}
