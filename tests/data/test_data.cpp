// Tests for loom/data: the IDX reader (plain, gzipped, and every kind of
// corruption), the MNIST split logic on tiny hand-made files, the batcher's
// TF-compatible epoch semantics and reproducible shuffling, and, when it is
// installed, the real Fashion-MNIST.
#include <doctest/doctest.h>

#include <loom/data/batcher.hpp>
#include <loom/data/idx.hpp>
#include <loom/data/mnist.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace loom::data;

namespace {

// A fresh directory under the system temp dir, removed with everything in it
// when the test ends (also when it fails).
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::random_device rd;
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() /
           ("loom_data_test_" + std::to_string(stamp) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  fs::path operator/(const std::string& name) const { return path / name; }
};

using bytes = std::vector<std::uint8_t>;

void put_be32(bytes& out, std::uint32_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 24));
  out.push_back(static_cast<std::uint8_t>(v >> 16));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}

bytes idx_file(std::uint8_t type, const std::vector<std::uint32_t>& dims, const bytes& payload) {
  bytes out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_plain(const fs::path& p, const bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

void write_gzip(const fs::path& p, const bytes& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty())
    REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

bytes read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bytes iota_bytes(std::size_t n) {
  bytes b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<std::uint8_t>(i * 7 + 3);
  return b;
}

// Runs f, which must throw exactly E; returns the message for further checks.
template <class E, class F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  } catch (const std::exception& e) {
    FAIL("threw the wrong exception type: " << e.what());
  }
  FAIL("did not throw");
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Writes a small MNIST-layout directory: n_train/n_test images of rows x cols,
// pixel (i, j) = (i * 31 + j) % 256 and label i % 10.
void write_tiny_mnist(const fs::path& dir, std::uint32_t n_train, std::uint32_t n_test,
                      std::uint32_t rows, std::uint32_t cols, bool gzip) {
  const auto images = [&](std::uint32_t n) {
    bytes px(static_cast<std::size_t>(n) * rows * cols);
    for (std::uint32_t i = 0; i < n; ++i)
      for (std::uint32_t j = 0; j < rows * cols; ++j)
        px[static_cast<std::size_t>(i) * rows * cols + j] =
            static_cast<std::uint8_t>((i * 31 + j) % 256);
    return idx_file(idx_ubyte, {n, rows, cols}, px);
  };
  const auto labels = [](std::uint32_t n) {
    bytes l(n);
    for (std::uint32_t i = 0; i < n; ++i)
      l[i] = static_cast<std::uint8_t>(i % 10);
    return idx_file(idx_ubyte, {n}, l);
  };
  const auto put = [&](const std::string& name, const bytes& b) {
    if (gzip)
      write_gzip(dir / (name + ".gz"), b);
    else
      write_plain(dir / name, b);
  };
  put("train-images-idx3-ubyte", images(n_train));
  put("train-labels-idx1-ubyte", labels(n_train));
  put("t10k-images-idx3-ubyte", images(n_test));
  put("t10k-labels-idx1-ubyte", labels(n_test));
}

// A dataset whose example i has every feature equal to i and label i % classes,
// so a batch row tells which example it came from.
dataset indexed_dataset(std::int64_t n, std::int64_t features = 3, int classes = 10) {
  dataset d;
  d.num_classes = classes;
  d.images = loom::tensor<float, 2>(loom::shape{n, features});
  d.labels = loom::tensor<std::int64_t, 1>(loom::shape{n});
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < features; ++j)
      d.images(i, j) = static_cast<float>(i);
    d.labels(i) = i % classes;
  }
  return d;
}

std::vector<std::int64_t> example_ids(const minibatch& b) {
  std::vector<std::int64_t> ids;
  for (std::int64_t r = 0; r < b.images.dim(0); ++r)
    ids.push_back(static_cast<std::int64_t>(b.images(r, 0)));
  return ids;
}

} // namespace

TEST_SUITE("data.idx") {

  TEST_CASE("plain and gzipped ubyte files read back identically") {
    temp_dir tmp;
    const bytes payload = iota_bytes(3 * 4 * 5);
    const bytes file = idx_file(idx_ubyte, {3, 4, 5}, payload);
    write_plain(tmp / "plain.idx", file);
    write_gzip(tmp / "packed.idx.gz", file);
    for (const auto& name : {"plain.idx", "packed.idx.gz"}) {
      CAPTURE(name);
      const idx_array a = read_idx(tmp / name);
      CHECK(a.type == idx_ubyte);
      CHECK(a.dims == std::vector<std::int64_t>{3, 4, 5});
      CHECK(a.num_elements() == 60);
      CHECK(a.element_size() == 1);
      CHECK(a.bytes == payload);
      CHECK(a.values<std::uint8_t>() == payload);
    }
  }

  TEST_CASE("gzip is recognised by its magic, not by the file name") {
    temp_dir tmp;
    const bytes payload = iota_bytes(10);
    const bytes file = idx_file(idx_ubyte, {10}, payload);
    write_gzip(tmp / "labels-no-suffix", file);
    write_plain(tmp / "labels-unpacked.gz", file);
    CHECK(read_idx(tmp / "labels-no-suffix").bytes == payload);
    CHECK(read_idx(tmp / "labels-unpacked.gz").bytes == payload);
  }

  TEST_CASE("multi-byte types are stored big-endian and converted by values<T>") {
    temp_dir tmp;
    SUBCASE("int32") {
      bytes payload;
      for (std::uint32_t v : {0x01020304u, 0xFFFFFFFEu, 7u})
        put_be32(payload, v);
      write_gzip(tmp / "i.gz", idx_file(idx_int, {3}, payload));
      const idx_array a = read_idx(tmp / "i.gz");
      CHECK(a.type == idx_int);
      CHECK(a.element_size() == 4);
      CHECK(a.values<std::int32_t>() == std::vector<std::int32_t>{0x01020304, -2, 7});
      CHECK_THROWS_AS(a.values<float>(), loom::invalid_argument_error);
    }
    SUBCASE("int16 and sbyte") {
      write_plain(tmp / "s", idx_file(idx_short, {2}, bytes{0xFF, 0xFE, 0x01, 0x00}));
      CHECK(read_idx(tmp / "s").values<std::int16_t>() == std::vector<std::int16_t>{-2, 256});
      write_plain(tmp / "b", idx_file(idx_sbyte, {2}, bytes{0x80, 0x7F}));
      CHECK(read_idx(tmp / "b").values<std::int8_t>() == std::vector<std::int8_t>{-128, 127});
    }
    SUBCASE("float and double in a 2-D array") {
      bytes payload;
      for (float v : {1.5f, -2.0f, 0.25f, 3.0f}) {
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        put_be32(payload, u);
      }
      write_plain(tmp / "f", idx_file(idx_float, {2, 2}, payload));
      const idx_array a = read_idx(tmp / "f");
      CHECK(a.dims == std::vector<std::int64_t>{2, 2});
      CHECK(a.values<float>() == std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f});

      bytes dpayload;
      const double dv = -0.1;
      std::uint64_t u;
      std::memcpy(&u, &dv, 8);
      put_be32(dpayload, static_cast<std::uint32_t>(u >> 32));
      put_be32(dpayload, static_cast<std::uint32_t>(u));
      write_gzip(tmp / "d", idx_file(idx_double, {1}, dpayload));
      CHECK(read_idx(tmp / "d").values<double>() == std::vector<double>{-0.1});
    }
    SUBCASE("a zero dimension means an empty payload") {
      write_plain(tmp / "z", idx_file(idx_int, {0, 5}, {}));
      const idx_array a = read_idx(tmp / "z");
      CHECK(a.num_elements() == 0);
      CHECK(a.bytes.empty());
    }
  }

  TEST_CASE("a missing file is not_found, naming the path") {
    temp_dir tmp;
    const auto p = tmp / "nope-idx3-ubyte.gz";
    const auto msg = message_of<loom::not_found_error>([&] { read_idx(p); });
    CHECK(contains(msg, p.string()));
    CHECK(contains(message_of<loom::not_found_error>([&] { read_idx(tmp.path); }),
                   tmp.path.string()));
  }

  TEST_CASE("bad magic is data_loss, naming the path") {
    temp_dir tmp;
    for (bool gz : {false, true}) {
      CAPTURE(gz);
      const auto p = tmp / (gz ? "bad.gz" : "bad");
      const auto write = [&](const bytes& b) { gz ? write_gzip(p, b) : write_plain(p, b); };

      write(bytes{0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 9});
      auto msg = message_of<loom::data_loss_error>([&] { read_idx(p); });
      CHECK(contains(msg, p.string()));
      CHECK(contains(msg, "bad magic number 0x12340801"));

      write(bytes{0, 0, 0x07, 0x01, 0, 0, 0, 1, 9}); // 0x07 is not a type byte
      msg = message_of<loom::data_loss_error>([&] { read_idx(p); });
      CHECK(contains(msg, "bad magic number 0x00000701"));

      write(bytes{0, 0}); // shorter than the magic
      msg = message_of<loom::data_loss_error>([&] { read_idx(p); });
      CHECK(contains(msg, p.string()));
      CHECK(contains(msg, "truncated"));

      write(bytes{}); // empty file
      CHECK(contains(message_of<loom::data_loss_error>([&] { read_idx(p); }), "truncated"));
    }
  }

  TEST_CASE("a truncated payload is data_loss with both sizes in the message") {
    temp_dir tmp;
    bytes file = idx_file(idx_ubyte, {3, 2, 2}, iota_bytes(12));
    file.resize(file.size() - 7); // 5 of 12 payload bytes left
    write_plain(tmp / "short", file);
    write_gzip(tmp / "short.gz", file);
    auto msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "short"); });
    CHECK(msg == "IDX file " + (tmp / "short").string() +
                     " is truncated: header says 3x2x2 = 12 bytes, file has 5");
    msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "short.gz"); });
    CHECK(contains(msg, (tmp / "short.gz").string()));
    CHECK(contains(msg, "header says 3x2x2 = 12 bytes, file has 5"));

    // Multi-byte element types say so.
    write_plain(tmp / "ints", idx_file(idx_int, {10, 3}, iota_bytes(100)));
    msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "ints"); });
    CHECK(contains(msg, "header says 10x3 int32 (4 bytes each) = 120 bytes, file has 100"));

    // A header cut inside its dimensions.
    write_plain(tmp / "hdr", bytes{0, 0, 8, 3, 0, 0, 0, 2, 0, 0});
    msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "hdr"); });
    CHECK(contains(msg, (tmp / "hdr").string()));
    CHECK(contains(msg, "3 dimensions"));
  }

  TEST_CASE("a gzip stream cut short is data_loss") {
    temp_dir tmp;
    const bytes file = idx_file(idx_ubyte, {50, 20}, iota_bytes(1000));
    write_gzip(tmp / "full.gz", file);
    const bytes gz = read_all(tmp / "full.gz");
    // Cut in the compressed data, and cut only the 8-byte CRC/length trailer.
    for (std::size_t keep : {gz.size() / 2, gz.size() - 4}) {
      CAPTURE(keep);
      write_plain(tmp / "cut.gz",
                  bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(keep)));
      const auto msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "cut.gz"); });
      CHECK(contains(msg, (tmp / "cut.gz").string()));
      CHECK(contains(msg, "truncated"));
    }
  }

  TEST_CASE("trailing bytes after the payload are data_loss") {
    temp_dir tmp;
    bytes file = idx_file(idx_ubyte, {4}, iota_bytes(4));
    file.insert(file.end(), {1, 2, 3});
    write_plain(tmp / "long", file);
    write_gzip(tmp / "long.gz", file);
    for (const auto& name : {"long", "long.gz"}) {
      const auto msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / name); });
      CHECK(contains(msg, (tmp / name).string()));
      CHECK(contains(msg, "has trailing data: header says 4 = 4 bytes, file has 7"));
    }
  }

  TEST_CASE("an implausibly large header is data_loss before any allocation") {
    temp_dir tmp;
    // 2^32-1 cubed overflows 64 bits; 70000^3 does not but exceeds 2^34 bytes.
    for (std::uint32_t d : {0xFFFFFFFFu, 70000u}) {
      CAPTURE(d);
      const bytes file = idx_file(idx_double, {d, d, d}, iota_bytes(16));
      write_plain(tmp / "huge", file);
      write_gzip(tmp / "huge.gz", file);
      for (const auto& name : {"huge", "huge.gz"}) {
        const auto msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / name); });
        CHECK(contains(msg, (tmp / name).string()));
        CHECK(contains(msg, "limit"));
      }
    }
    // An empty array (a zero dimension) may not hide huge dimensions either.
    write_plain(tmp / "empty", idx_file(idx_ubyte, {0xFFFFFFFFu, 0xFFFFFFFFu, 0u}, {}));
    CHECK(contains(message_of<loom::data_loss_error>([&] { read_idx(tmp / "empty"); }), "limit"));
    // Within the limit but far more than a tiny gzip file holds: must come back
    // as truncated without reserving the claimed 16 GB.
    write_gzip(tmp / "claims.gz", idx_file(idx_ubyte, {1u << 17, 1u << 17}, iota_bytes(100)));
    const auto msg = message_of<loom::data_loss_error>([&] { read_idx(tmp / "claims.gz"); });
    CHECK(contains(msg, "= 17179869184 bytes, file has 100"));
  }

  TEST_CASE("corrupting any byte or truncating anywhere never crashes") {
    temp_dir tmp;
    const bytes file = idx_file(idx_short, {3, 4}, iota_bytes(24));
    bytes gz_image;
    {
      write_gzip(tmp / "g", file);
      gz_image = read_all(tmp / "g");
    }
    std::mt19937_64 rng(1234);
    int accepted = 0, rejected = 0;
    for (const bytes* base : std::array<const bytes*, 2>{&file, &gz_image}) {
      for (std::size_t len = 0; len <= base->size(); ++len) {
        write_plain(tmp / "t",
                    bytes(base->begin(), base->begin() + static_cast<std::ptrdiff_t>(len)));
        try {
          (void)read_idx(tmp / "t");
          ++accepted;
        } catch (const loom::error&) {
          ++rejected;
        }
      }
      for (std::size_t pos = 0; pos < base->size(); ++pos) {
        for (int flip = 0; flip < 4; ++flip) {
          bytes b = *base;
          b[pos] = static_cast<std::uint8_t>(rng());
          write_plain(tmp / "t", b);
          try {
            const idx_array a = read_idx(tmp / "t");
            CHECK(a.bytes.size() == static_cast<std::size_t>(a.num_elements()) * a.element_size());
            ++accepted;
          } catch (const loom::error&) {
            ++rejected;
          }
        }
      }
    }
    CHECK(rejected > 0);
    CHECK(accepted > 0); // flips inside the payload leave a valid file
  }

} // TEST_SUITE("data.idx")

TEST_SUITE("data.mnist") {

  TEST_CASE("read_mnist splits the first validation_size training examples off") {
    for (bool gz : {false, true}) {
      CAPTURE(gz);
      temp_dir dir;
      write_tiny_mnist(dir.path, 20, 6, 2, 3, gz);
      const mnist_splits s = read_mnist(dir.path, 5);
      CHECK(s.validation.size() == 5);
      CHECK(s.train.size() == 15);
      CHECK(s.test.size() == 6);
      CHECK(s.train.images.shape() == loom::shape{15, 6});
      CHECK(s.train.feature_size() == 6);
      CHECK(s.train.image_rows == 2);
      CHECK(s.train.image_cols == 3);
      CHECK(s.train.num_classes == 10);
      // validation = examples 0..4, train = examples 5..19, in file order.
      for (std::int64_t i = 0; i < 5; ++i)
        CHECK(s.validation.labels(i) == i % 10);
      for (std::int64_t i = 0; i < 15; ++i)
        CHECK(s.train.labels(i) == (i + 5) % 10);
      for (std::int64_t i = 0; i < 15; ++i)
        for (std::int64_t j = 0; j < 6; ++j) {
          const auto px = static_cast<std::uint8_t>(((i + 5) * 31 + j) % 256);
          CHECK(s.train.images(i, j) == static_cast<float>(px) * static_cast<float>(1.0 / 255.0));
        }
      CHECK(s.test.images(5, 0) == static_cast<float>(5 * 31) * static_cast<float>(1.0 / 255.0));
    }
  }

  TEST_CASE("pixel scaling maps 0 to 0 and 255 to exactly 1") {
    temp_dir dir;
    write_plain(dir / "i", idx_file(idx_ubyte, {1, 1, 3}, bytes{0, 128, 255}));
    write_plain(dir / "l", idx_file(idx_ubyte, {1}, bytes{9}));
    const dataset d = read_mnist_pair(dir / "i", dir / "l");
    CHECK(d.images(0, 0) == 0.f);
    CHECK(d.images(0, 1) == doctest::Approx(128.0 / 255.0));
    CHECK(d.images(0, 2) == 1.f);
    CHECK(d.labels(0) == 9);
  }

  TEST_CASE("validation_size 0 and the whole training set are allowed, beyond is not") {
    temp_dir dir;
    write_tiny_mnist(dir.path, 8, 2, 1, 2, true);
    CHECK(read_mnist(dir.path, 0).train.size() == 8);
    const auto all = read_mnist(dir.path, 8);
    CHECK(all.train.size() == 0);
    CHECK(all.validation.size() == 8);
    CHECK(contains(message_of<loom::invalid_argument_error>([&] { read_mnist(dir.path, 9); }),
                   "between 0 and 8"));
    CHECK_THROWS_AS(read_mnist(dir.path, -1), loom::invalid_argument_error);
  }

  TEST_CASE("read_mnist accepts a mix of .gz and plain names") {
    temp_dir dir;
    write_tiny_mnist(dir.path, 10, 4, 2, 2, true);
    fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
    bytes l(4, 3);
    write_plain(dir / "t10k-labels-idx1-ubyte", idx_file(idx_ubyte, {4}, l));
    const auto s = read_mnist(dir.path, 2);
    CHECK(s.test.labels(0) == 3);
  }

  TEST_CASE("MNIST corruption is reported naming the file") {
    temp_dir dir;
    write_tiny_mnist(dir.path, 10, 4, 2, 2, false);

    SUBCASE("missing directory") {
      const auto p = dir / "absent";
      CHECK(contains(message_of<loom::not_found_error>([&] { read_mnist(p); }), p.string()));
    }
    SUBCASE("missing file") {
      fs::remove(dir / "t10k-images-idx3-ubyte");
      const auto msg = message_of<loom::not_found_error>([&] { read_mnist(dir.path); });
      CHECK(contains(msg, "t10k-images-idx3-ubyte"));
      CHECK(contains(msg, dir.path.string()));
    }
    SUBCASE("label out of range") {
      bytes l(10, 1);
      l[7] = 10;
      const auto p = dir / "train-labels-idx1-ubyte";
      write_plain(p, idx_file(idx_ubyte, {10}, l));
      const auto msg = message_of<loom::data_loss_error>([&] { read_mnist(dir.path, 2); });
      CHECK(contains(msg, p.string()));
      CHECK(contains(msg, "label 10 at index 7"));
    }
    SUBCASE("image and label counts disagree") {
      const auto p = dir / "t10k-labels-idx1-ubyte";
      write_plain(p, idx_file(idx_ubyte, {3}, bytes(3, 0)));
      const auto msg = message_of<loom::data_loss_error>([&] { read_mnist(dir.path, 2); });
      CHECK(contains(msg, p.string()));
      CHECK(contains(msg, (dir / "t10k-images-idx3-ubyte").string()));
      CHECK(contains(msg, "4 images but"));
    }
    SUBCASE("labels stored as images") {
      const auto p = dir / "train-labels-idx1-ubyte";
      write_plain(p, idx_file(idx_ubyte, {10, 1, 1}, bytes(10, 0)));
      CHECK(contains(message_of<loom::data_loss_error>([&] { read_mnist(dir.path); }), p.string()));
    }
    SUBCASE("test images of another size") {
      write_plain(dir / "t10k-images-idx3-ubyte", idx_file(idx_ubyte, {4, 3, 3}, bytes(36, 0)));
      const auto msg = message_of<loom::data_loss_error>([&] { read_mnist(dir.path, 2); });
      CHECK(contains(msg, "2x2"));
      CHECK(contains(msg, "3x3"));
    }
    SUBCASE("a truncated image file") {
      const auto p = dir / "train-images-idx3-ubyte";
      bytes b = read_all(p);
      b.resize(b.size() - 1);
      write_plain(p, b);
      const auto msg = message_of<loom::data_loss_error>([&] { read_mnist(dir.path, 2); });
      CHECK(contains(msg, p.string()));
      CHECK(contains(msg, "header says 10x2x2 = 40 bytes, file has 39"));
    }
  }

  TEST_CASE("one_hot") {
    const loom::tensor<std::int64_t, 1> labels(loom::shape{4},
                                               std::vector<std::int64_t>{2, 0, 3, 2});
    const auto oh = one_hot(labels, 4);
    CHECK(oh.shape() == loom::shape{4, 4});
    const std::vector<float> expected{0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0};
    CHECK(std::vector<float>(oh.flat().begin(), oh.flat().end()) == expected);
    CHECK(one_hot(loom::tensor<std::int64_t, 1>(loom::shape{0}), 10).shape() == loom::shape{0, 10});
    CHECK(contains(message_of<loom::invalid_argument_error>([&] { one_hot(labels, 3); }),
                   "label 3 at index 2"));
    CHECK_THROWS_AS(one_hot(labels, 0), loom::invalid_argument_error);
    const loom::tensor<std::int64_t, 1> negative(loom::shape{1}, std::vector<std::int64_t>{-1});
    CHECK_THROWS_AS(one_hot(negative, 10), loom::invalid_argument_error);
  }

  // Reads the real dataset when the machine has it. doctest cannot decide to skip
  // a test at run time, so without the files this test passes after saying
  // "skipped" in a MESSAGE.
  TEST_CASE("real Fashion-MNIST, if installed") {
    const fs::path dir{std::string(default_fashion_mnist_dir)};
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      MESSAGE("skipped: Fashion-MNIST not found at " << dir.string());
      return;
    }
    const mnist_splits s = read_mnist(dir);
    CHECK(s.train.size() == 55000);
    CHECK(s.validation.size() == 5000);
    CHECK(s.test.size() == 10000);
    CHECK(s.train.images.shape() == loom::shape{55000, 784});
    CHECK(s.test.images.shape() == loom::shape{10000, 784});

    for (const dataset* d : {&s.train, &s.validation, &s.test}) {
      const auto px = d->images.flat();
      const auto [lo, hi] = std::minmax_element(px.begin(), px.end());
      CHECK(*lo == 0.f);
      CHECK(*hi == 1.f);
    }
    std::array<std::int64_t, 10> train_hist{}, test_hist{};
    for (const dataset* d : {&s.train, &s.validation})
      for (auto l : d->labels.flat())
        ++train_hist[static_cast<std::size_t>(l)];
    for (auto l : s.test.labels.flat())
      ++test_hist[static_cast<std::size_t>(l)];
    for (std::size_t c = 0; c < 10; ++c) {
      CAPTURE(c);
      CHECK(train_hist[c] == 6000);
      CHECK(test_hist[c] == 1000);
    }
    // The first training example of Fashion-MNIST is an ankle boot (class 9);
    // it must be the first validation example, as in TF.
    CHECK(s.validation.labels(0) == 9);
  }

} // TEST_SUITE("data.mnist")

TEST_SUITE("data.batcher") {

  TEST_CASE("batch shapes and contents agree") {
    const dataset d = make_synthetic(50, 7);
    batcher b(d, 16, 1);
    const minibatch x = b.next_batch();
    CHECK(x.images.shape() == loom::shape{16, 784});
    CHECK(x.labels_one_hot.shape() == loom::shape{16, 10});
    CHECK(x.labels.shape() == loom::shape{16});
    for (std::int64_t r = 0; r < 16; ++r) {
      const std::int64_t ex = b.order()[static_cast<std::size_t>(r)];
      CHECK(x.labels(r) == d.labels(ex));
      CHECK(x.images(r, 100) == d.images(ex, 100));
      for (std::int64_t c = 0; c < 10; ++c)
        CHECK(x.labels_one_hot(r, c) == (c == x.labels(r) ? 1.f : 0.f));
    }
    CHECK(b.examples_seen() == 16);
    CHECK(b.epochs_completed() == 0);
  }

  TEST_CASE("every example is seen exactly once per epoch, across epoch boundaries") {
    const std::int64_t n = 10, bs = 3;
    batcher b(indexed_dataset(n), bs, 42);
    std::vector<std::int64_t> stream;
    for (int i = 0; i < 10; ++i) {
      const auto ids = example_ids(b.next_batch());
      CHECK(ids.size() == static_cast<std::size_t>(bs));
      stream.insert(stream.end(), ids.begin(), ids.end());
    }
    CHECK(b.examples_seen() == 30);
    // Batch 4 crossed into epoch 2 and batch 7 into epoch 3; the third epoch is
    // used up but, as in TF, counts as completed only when the next batch is drawn.
    CHECK(b.epochs_completed() == 2);
    CHECK(b.index_in_epoch() == 10);
    for (std::size_t e = 0; e < 3; ++e) {
      CAPTURE(e);
      std::vector<std::int64_t> epoch(stream.begin() + static_cast<std::ptrdiff_t>(e * n),
                                      stream.begin() + static_cast<std::ptrdiff_t>((e + 1) * n));
      std::sort(epoch.begin(), epoch.end());
      for (std::int64_t i = 0; i < n; ++i)
        CHECK(epoch[static_cast<std::size_t>(i)] == i);
    }
    // Each epoch is reshuffled.
    CHECK(!std::equal(stream.begin(), stream.begin() + n, stream.begin() + n));
  }

  TEST_CASE("without shuffling batches walk the data in order, wrapping like TF") {
    batcher b(indexed_dataset(5), 2, 0, false);
    CHECK(example_ids(b.next_batch()) == std::vector<std::int64_t>{0, 1});
    CHECK(example_ids(b.next_batch()) == std::vector<std::int64_t>{2, 3});
    CHECK(b.epochs_completed() == 0);
    CHECK(example_ids(b.next_batch()) == std::vector<std::int64_t>{4, 0});
    CHECK(b.epochs_completed() == 1);
    CHECK(b.index_in_epoch() == 1);
    CHECK(example_ids(b.next_batch()) == std::vector<std::int64_t>{1, 2});

    // An exact fit completes the epoch on the following call, as in TF.
    batcher whole(indexed_dataset(4), 4, 0, false);
    CHECK(example_ids(whole.next_batch()) == std::vector<std::int64_t>{0, 1, 2, 3});
    CHECK(whole.epochs_completed() == 0);
    CHECK(example_ids(whole.next_batch()) == std::vector<std::int64_t>{0, 1, 2, 3});
    CHECK(whole.epochs_completed() == 1);
  }

  TEST_CASE("same seed gives the same order, a different seed a different one") {
    const dataset d = indexed_dataset(100);
    const auto run = [&](std::uint64_t seed) {
      batcher b(d, 32, seed);
      std::vector<std::int64_t> s;
      for (int i = 0; i < 8; ++i) {
        const auto ids = example_ids(b.next_batch());
        s.insert(s.end(), ids.begin(), ids.end());
      }
      return s;
    };
    CHECK(run(5) == run(5));
    CHECK(run(5) != run(6));
  }

  TEST_CASE("shuffling is pinned to mt19937_64, independent of the standard library") {
    // The standard fixes mt19937_64's output, and the draw and Fisher-Yates are
    // ours, so these values must hold on every platform and compiler.
    std::mt19937_64 rng(2024);
    std::vector<int> v{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    shuffle_in_place(v, rng);
    std::vector<int> again{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::mt19937_64 rng2(2024);
    shuffle_in_place(again, rng2);
    CHECK(v == again);
    CHECK(v == std::vector<int>{1, 3, 6, 0, 2, 8, 7, 5, 9, 4});

    std::mt19937_64 r(1);
    for (int i = 0; i < 1000; ++i)
      CHECK(uniform_below(r, 7) < 7);
    CHECK(uniform_below(r, 1) == 0);
    const float u = uniform_unit(r);
    CHECK(u >= 0.f);
    CHECK(u < 1.f);
  }

  TEST_CASE("batcher validates its arguments") {
    const dataset d = indexed_dataset(10);
    CHECK(contains(message_of<loom::invalid_argument_error>([&] { batcher(d, 0, 1); }),
                   "batch_size must be positive"));
    CHECK_THROWS_AS(batcher(d, -3, 1), loom::invalid_argument_error);
    CHECK(contains(message_of<loom::invalid_argument_error>([&] { batcher(d, 11, 1); }),
                   "exceeds the dataset size 10"));
    CHECK_NOTHROW(batcher(d, 10, 1));

    dataset bad = indexed_dataset(4);
    bad.labels(2) = 10;
    CHECK(contains(message_of<loom::invalid_argument_error>([&] { batcher(bad, 2, 1); }),
                   "label 10 of example 2"));
    CHECK_THROWS_AS(batcher(dataset{}, 1, 1), loom::invalid_argument_error);
  }

  TEST_CASE("batches do not alias each other or the dataset") {
    const dataset d = indexed_dataset(6);
    batcher b(d, 3, 9, false);
    minibatch first = b.next_batch();
    const minibatch second = b.next_batch();
    first.images(0, 0) = 100.f;
    CHECK(second.images(0, 0) == 3.f);
    CHECK(d.images(0, 0) == 0.f);
  }

  TEST_CASE("make_synthetic is deterministic, in range and learnable") {
    const dataset a = make_synthetic(2000, 3), b = make_synthetic(2000, 3),
                  c = make_synthetic(2000, 4);
    CHECK(a.images.shape() == loom::shape{2000, 784});
    CHECK(a.labels.shape() == loom::shape{2000});
    CHECK(a.num_classes == 10);
    CHECK(std::equal(a.images.flat().begin(), a.images.flat().end(), b.images.flat().begin()));
    CHECK(std::equal(a.labels.flat().begin(), a.labels.flat().end(), b.labels.flat().begin()));
    CHECK(!std::equal(a.images.flat().begin(), a.images.flat().end(), c.images.flat().begin()));
    const auto px = a.images.flat();
    const auto [lo, hi] = std::minmax_element(px.begin(), px.end());
    CHECK(*lo >= 0.f);
    CHECK(*hi <= 1.f);

    // Every class occurs, and nearest class centroid (fit on the first half)
    // classifies the second half almost perfectly.
    std::array<std::int64_t, 10> count{};
    std::vector<double> centroid(10 * 784, 0.0);
    for (std::int64_t i = 0; i < 1000; ++i) {
      const auto l = static_cast<std::size_t>(a.labels(i));
      ++count[l];
      for (std::int64_t j = 0; j < 784; ++j)
        centroid[l * 784 + static_cast<std::size_t>(j)] += a.images(i, j);
    }
    for (std::size_t l = 0; l < 10; ++l) {
      REQUIRE(count[l] > 0);
      for (std::size_t j = 0; j < 784; ++j)
        centroid[l * 784 + j] /= static_cast<double>(count[l]);
    }
    int correct = 0;
    for (std::int64_t i = 1000; i < 2000; ++i) {
      std::size_t best = 0;
      double best_d = 1e300;
      for (std::size_t l = 0; l < 10; ++l) {
        double dist = 0;
        for (std::int64_t j = 0; j < 784; ++j) {
          const double diff = a.images(i, j) - centroid[l * 784 + static_cast<std::size_t>(j)];
          dist += diff * diff;
        }
        if (dist < best_d)
          best_d = dist, best = l;
      }
      correct += static_cast<std::int64_t>(best) == a.labels(i);
    }
    CHECK(correct >= 950);

    CHECK(make_synthetic(0, 1).size() == 0);
    CHECK_THROWS_AS(make_synthetic(-1, 1), loom::invalid_argument_error);
  }

} // TEST_SUITE("data.batcher")
