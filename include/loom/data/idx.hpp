// Reader for IDX files, the container MNIST and Fashion-MNIST ship in.
//
// Files are read through zlib's gzread, which inflates gzip input and passes
// plain input through, so a file is recognised as gzipped by its 1f 8b magic and
// never by its name (datasets are often unpacked but keep their .gz names, or
// the reverse).
//
// Everything in a file is untrusted: a corrupt or hostile header must produce a
// loom::data_loss_error that names the file, never a crash or a huge
// allocation. Hence the size limit, and hence the payload buffer grows with the
// bytes that actually arrive instead of being sized from the header up front
// (a gzip file of a few bytes can claim gigabytes).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace loom::data {

// The IDX type byte (third byte of the magic number).
enum idx_type : std::uint8_t {
  idx_ubyte = 0x08,
  idx_sbyte = 0x09,
  idx_short = 0x0B,
  idx_int = 0x0C,
  idx_float = 0x0D,
  idx_double = 0x0E,
};

// Bytes per element for a type byte; 0 for a byte that is not an IDX type.
constexpr std::size_t idx_element_size(std::uint8_t type) noexcept {
  switch (type) {
  case idx_ubyte:
  case idx_sbyte: return 1;
  case idx_short: return 2;
  case idx_int:
  case idx_float: return 4;
  case idx_double: return 8;
  default: return 0;
  }
}

constexpr std::string_view idx_type_name(std::uint8_t type) noexcept {
  switch (type) {
  case idx_ubyte: return "ubyte";
  case idx_sbyte: return "sbyte";
  case idx_short: return "int16";
  case idx_int: return "int32";
  case idx_float: return "float32";
  case idx_double: return "float64";
  default: return "unknown";
  }
}

// A payload larger than this is treated as corruption rather than data: it is
// far beyond any IDX dataset in use, and it bounds what a bad header can make
// us allocate.
inline constexpr std::uint64_t idx_max_payload_bytes = std::uint64_t{1} << 34;

namespace detail {
template <class T> constexpr std::uint8_t idx_type_of() noexcept {
  if constexpr (std::is_same_v<T, std::uint8_t>)
    return idx_ubyte;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return idx_sbyte;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return idx_short;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return idx_int;
  else if constexpr (std::is_same_v<T, float>)
    return idx_float;
  else if constexpr (std::is_same_v<T, double>)
    return idx_double;
  else
    return 0;
}
} // namespace detail

// One IDX file's contents. `bytes` is the payload exactly as stored, so
// multi-byte elements are big-endian; values<T>() converts them. The common
// case (ubyte images and labels) needs no conversion and is used in place.
struct idx_array {
  std::uint8_t type = idx_ubyte;
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;

  std::size_t element_size() const noexcept { return idx_element_size(type); }
  std::int64_t num_elements() const noexcept {
    std::int64_t n = 1;
    for (auto d : dims)
      n *= d;
    return n;
  }

  // The elements in host byte order. T must match the type byte.
  template <class T> std::vector<T> values() const {
    static_assert(detail::idx_type_of<T>() != 0,
                  "idx_array::values<T>: T must be uint8_t, int8_t, int16_t, int32_t, "
                  "float or double");
    if (detail::idx_type_of<T>() != type)
      throw invalid_argument_error("IDX array holds " + std::string(idx_type_name(type)) +
                                   ", read as " +
                                   std::string(idx_type_name(detail::idx_type_of<T>())));
    const std::size_t n = bytes.size() / sizeof(T);
    std::vector<T> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      unsigned char b[sizeof(T)];
      std::memcpy(b, bytes.data() + i * sizeof(T), sizeof(T));
      if constexpr (std::endian::native == std::endian::little)
        std::reverse(b, b + sizeof(T));
      std::memcpy(&out[i], b, sizeof(T));
    }
    return out;
  }
};

namespace detail {

struct gz_closer {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using gz_ptr = std::unique_ptr<std::remove_pointer_t<gzFile>, gz_closer>;

inline std::string idx_where(const std::filesystem::path& p) {
  return "IDX file " + p.string();
}

LOOM_COMPILED_ONCE std::string idx_dims_string(const std::vector<std::int64_t>& dims);

// "60000x28x28 = 47040000 bytes", or "10x3 int32 (4 bytes each) = 120 bytes".
LOOM_COMPILED_ONCE std::string idx_size_string(const std::vector<std::int64_t>& dims,
                                               std::uint8_t type, std::uint64_t bytes);

// gzread takes an unsigned and returns an int, so one call reads at most this.
inline constexpr std::size_t gz_max_chunk = std::size_t{1} << 30;

LOOM_COMPILED_ONCE std::string gz_error_text(gzFile f);

// Reads up to n bytes; returns how many arrived (fewer only at end of input).
LOOM_COMPILED_ONCE std::size_t gz_read_fully(gzFile f, std::uint8_t* dst, std::size_t n,
                                             const std::filesystem::path& path);

// Z_BUF_ERROR after end of input means the gzip stream stopped mid-member
// (gzread reports that as a short read, not as an error).
inline bool gz_stream_cut_short(gzFile f) {
  int code = Z_OK;
  gzerror(f, &code);
  return code == Z_BUF_ERROR;
}

LOOM_COMPILED_ONCE std::uint32_t read_be32(const std::uint8_t* p) noexcept;

} // namespace detail

// Reads a whole IDX file, gzipped or plain. Throws not_found_error if the path
// does not name a readable file and data_loss_error if its contents are not a
// well-formed IDX array; both messages name the path.
LOOM_COMPILED_ONCE idx_array read_idx(const std::filesystem::path& path);

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data::detail {

LOOM_COMPILED_ONCE std::string idx_dims_string(const std::vector<std::int64_t>& dims) {
  if (dims.empty())
    return "a scalar";
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i)
      s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

LOOM_COMPILED_ONCE std::string idx_size_string(const std::vector<std::int64_t>& dims,
                                               std::uint8_t type, std::uint64_t bytes) {
  std::string s = idx_dims_string(dims);
  if (idx_element_size(type) != 1)
    s += " " + std::string(idx_type_name(type)) + " (" + std::to_string(idx_element_size(type)) +
         " bytes each)";
  return s + " = " + std::to_string(bytes) + " bytes";
}

LOOM_COMPILED_ONCE std::string gz_error_text(gzFile f) {
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO)
    return std::strerror(errno);
  return msg && *msg ? std::string(msg) : std::string("zlib error ") + std::to_string(code);
}

LOOM_COMPILED_ONCE std::size_t gz_read_fully(gzFile f, std::uint8_t* dst, std::size_t n,
                                             const std::filesystem::path& path) {
  std::size_t got = 0;
  while (got < n) {
    const std::size_t want = std::min(n - got, gz_max_chunk);
    const int r = gzread(f, dst + got, static_cast<unsigned>(want));
    if (r < 0)
      throw data_loss_error(idx_where(path) + " cannot be read: " + gz_error_text(f));
    if (r == 0)
      break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

LOOM_COMPILED_ONCE std::uint32_t read_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}
} // namespace loom::data::detail

namespace loom::data {

LOOM_COMPILED_ONCE idx_array read_idx(const std::filesystem::path& path) {
  using detail::idx_where;
  namespace fs = std::filesystem;

  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status))
    throw not_found_error(idx_where(path) + " does not exist");
  if (fs::is_directory(status))
    throw not_found_error(idx_where(path) + " is a directory, not a file");

  errno = 0;
#ifdef _WIN32
  detail::gz_ptr file(gzopen_w(path.c_str(), "rb"));
#else
  detail::gz_ptr file(gzopen(path.c_str(), "rb"));
#endif
  if (!file) {
    const std::string why = errno ? std::strerror(errno) : "zlib could not open it";
    if (errno == EACCES)
      throw permission_denied_error(idx_where(path) + " cannot be opened: " + why);
    throw not_found_error(idx_where(path) + " cannot be opened: " + why);
  }
  // The default 8 KiB buffer makes inflating a 26 MB dataset noticeably slower.
  gzbuffer(file.get(), 1u << 17);
  gzFile f = file.get();

  std::uint8_t magic[4];
  const std::size_t got_magic = detail::gz_read_fully(f, magic, 4, path);
  if (got_magic < 4)
    throw data_loss_error(idx_where(path) + " is truncated: it has " + std::to_string(got_magic) +
                          " bytes, fewer than the 4-byte magic number");
  // Only now, after the first read, does zlib know whether it saw a gzip magic.
  const bool gzipped = gzdirect(f) == 0;
  const std::uint32_t m = detail::read_be32(magic);
  if (magic[0] != 0 || magic[1] != 0 || idx_element_size(magic[2]) == 0) {
    char hex[11];
    std::snprintf(hex, sizeof hex, "0x%08X", static_cast<unsigned>(m));
    throw data_loss_error(idx_where(path) + " has bad magic number " + hex +
                          (gzipped ? " (after gzip decompression)" : "") +
                          ": expected 0x0000TTNN with type byte TT one of 08, 09, 0B, 0C, 0D, "
                          "0E and NN the number of dimensions");
  }

  idx_array out;
  out.type = magic[2];
  const std::size_t rank = magic[3];
  std::uint8_t dim_bytes[4 * 255];
  const std::size_t got_dims = detail::gz_read_fully(f, dim_bytes, 4 * rank, path);
  if (got_dims < 4 * rank)
    throw data_loss_error(idx_where(path) + " is truncated: its header declares " +
                          std::to_string(rank) + " dimensions (" + std::to_string(4 * rank) +
                          " bytes) but only " + std::to_string(got_dims) +
                          " bytes follow the magic");

  out.dims.resize(rank);
  bool any_zero = false;
  for (std::size_t i = 0; i < rank; ++i) {
    out.dims[i] = detail::read_be32(dim_bytes + 4 * i);
    any_zero = any_zero || out.dims[i] == 0;
  }
  // The limit applies to the product of the non-zero dimensions, so that an
  // empty array cannot carry dimensions whose product overflows in later
  // arithmetic (such as rows * cols). Each factor is < 2^32 and the running product is kept
  // <= 2^34 before the next multiply, so nothing here can overflow 64 bits.
  std::uint64_t payload = out.element_size();
  for (std::size_t i = 0; i < rank; ++i) {
    if (out.dims[i] == 0)
      continue;
    payload *= static_cast<std::uint64_t>(out.dims[i]);
    if (payload > idx_max_payload_bytes)
      throw data_loss_error(idx_where(path) + " has an implausible header: dimensions " +
                            detail::idx_dims_string(out.dims) + " of " +
                            std::string(idx_type_name(out.type)) + " exceed the " +
                            std::to_string(idx_max_payload_bytes) + "-byte limit");
  }
  if (any_zero)
    payload = 0;
  const std::uint64_t header = 4 + 4 * rank;
  const auto truncated = [&](std::uint64_t have, bool cut_stream) {
    return data_loss_error(idx_where(path) + " is truncated: header says " +
                           detail::idx_size_string(out.dims, out.type, payload) + ", file has " +
                           std::to_string(have) + (gzipped ? " after decompression" : "") +
                           (cut_stream ? " (the gzip stream ends unexpectedly)" : ""));
  };
  const auto trailing = [&](std::uint64_t extra, bool at_least) {
    return data_loss_error(idx_where(path) + " has trailing data: header says " +
                           detail::idx_size_string(out.dims, out.type, payload) + ", file has " +
                           (at_least ? "at least " : "") + std::to_string(payload + extra) +
                           (gzipped ? " after decompression" : ""));
  };

  // A plain file's size is known, so a wrong one is reported before reading.
  std::uint64_t alloc_limit = payload;
  if (!gzipped) {
    const auto size = fs::file_size(path, ec);
    if (!ec && size >= header) {
      const std::uint64_t have = size - header;
      if (have < payload)
        throw truncated(have, false);
      if (have > payload)
        throw trailing(have - payload, false);
    }
  } else {
    alloc_limit = std::min<std::uint64_t>(payload, std::uint64_t{64} << 20);
  }

  // Grow geometrically as data arrives, so memory tracks what the file really
  // holds; for real datasets alloc_limit already covers the payload.
  std::uint64_t got = 0;
  out.bytes.resize(static_cast<std::size_t>(alloc_limit));
  while (got < payload) {
    if (got == out.bytes.size())
      out.bytes.resize(static_cast<std::size_t>(
          std::min<std::uint64_t>(payload, std::max<std::uint64_t>(2 * got, 1u << 20))));
    const std::size_t want = out.bytes.size() - static_cast<std::size_t>(got);
    const std::size_t r = detail::gz_read_fully(f, out.bytes.data() + got, want, path);
    got += r;
    if (r < want)
      break;
  }
  if (got < payload)
    throw truncated(got, detail::gz_stream_cut_short(f));

  // Whatever follows the payload is corruption too; count it, within reason.
  std::uint8_t scratch[1 << 14];
  std::uint64_t extra = 0;
  const std::uint64_t count_limit = std::uint64_t{64} << 20;
  while (extra < count_limit) {
    const std::size_t r = detail::gz_read_fully(f, scratch, sizeof scratch, path);
    extra += r;
    if (r < sizeof scratch)
      break;
  }
  if (extra > 0)
    throw trailing(extra, extra >= count_limit);
  if (detail::gz_stream_cut_short(f))
    throw data_loss_error(idx_where(path) +
                          " is truncated: the gzip stream ends before its trailer (all " +
                          std::to_string(payload) + " payload bytes were present)");
  return out;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
