// loom-ckpt: lists the tensors of a checkpoint and prints their values (TF's
// inspect_checkpoint).
//
//   loom-ckpt /tmp/train/model-1000          name, dtype, shape, bytes, checksum
//   loom-ckpt /tmp/train                     the directory's latest checkpoint
//   loom-ckpt /tmp/train --print hid/w --limit 50
//
// Exits 0 when the file is sound, 1 when it is missing, truncated or corrupt
// (a bad checksum included), 2 on a usage error.
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/train/saver.hpp>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage = "usage: loom-ckpt <checkpoint file or directory> [--print NAME] "
                              "[--limit N]\n"
                              "  Lists the tensors of a loom checkpoint (a directory means its\n"
                              "  latest checkpoint); --print prints one tensor's first N values\n"
                              "  (default 20).\n";

struct options {
  std::string path;
  std::optional<std::string> print;
  std::int64_t limit = 20;
};

// Parses argv; nullopt after printing the usage (exit code in `code`).
std::optional<options> parse(int argc, char** argv, int& code) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> std::optional<std::string> {
      if (arg.rfind(flag, 0) != 0)
        return std::nullopt;
      if (arg.size() > flag.size() && arg[flag.size()] == '=')
        return std::string(arg.substr(flag.size() + 1));
      if (arg.size() == flag.size() && i + 1 < argc)
        return std::string(argv[++i]);
      if (arg.size() == flag.size())
        throw loom::invalid_argument_error(std::string(flag) + " needs a value");
      return std::nullopt;
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << usage;
      code = 0;
      return std::nullopt;
    }
    if (auto v = value("--print")) {
      o.print = *v;
    } else if (auto n = value("--limit")) {
      std::int64_t limit = 0;
      auto [end, ec] = std::from_chars(n->data(), n->data() + n->size(), limit);
      if (ec != std::errc() || end != n->data() + n->size() || limit < 0) {
        std::cerr << "loom-ckpt: --limit needs a number >= 0, not '" << *n << "'\n" << usage;
        code = 2;
        return std::nullopt;
      }
      o.limit = limit;
    } else if (arg.rfind("--", 0) == 0 || !o.path.empty()) {
      std::cerr << "loom-ckpt: unexpected argument '" << arg << "'\n" << usage;
      code = 2;
      return std::nullopt;
    } else {
      o.path = std::string(arg);
    }
  }
  if (o.path.empty()) {
    std::cerr << usage;
    code = 2;
    return std::nullopt;
  }
  return o;
}

template <class T> void print_value(std::ostream& out, const T& v) {
  if constexpr (std::is_same_v<T, std::string>)
    out << std::quoted(v);
  else if constexpr (std::is_same_v<T, bool>)
    out << (v ? "true" : "false");
  else if constexpr (std::is_floating_point_v<T>) {
    char buf[64]; // the shortest text that reads back as the same value
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.write(buf, r.ptr - buf);
  } else
    out << v;
}

void print_tensor(const loom::checkpoint_entry& e, const loom::any_tensor& t, std::int64_t limit) {
  std::ostringstream out;
  out << e.name << ": " << to_string(e.type) << e.shape.to_string() << " = [";
  const std::int64_t n = t.num_elements();
  const std::int64_t shown = std::min(n, limit);
  loom::visit_dtype(t.type(), [&]<class T>() {
    const T* data = t.data<T>();
    for (std::int64_t i = 0; i < shown; ++i) {
      if (i)
        out << ", ";
      print_value(out, data[i]);
    }
  });
  if (shown < n)
    out << (shown ? ", " : "") << "... (" << (n - shown) << " more)";
  out << "]\n";
  std::cout << out.str();
}

} // namespace

int main(int argc, char** argv) try {
  int code = 0;
  std::optional<options> o;
  try {
    o = parse(argc, argv, code);
  } catch (const loom::error& e) {
    std::cerr << "loom-ckpt: " << e.message() << "\n" << usage;
    return 2;
  }
  if (!o)
    return code;

  std::string path = o->path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    auto latest = loom::latest_checkpoint(path);
    if (!latest) {
      std::cerr << "loom-ckpt: directory " << path
                << " has no checkpoint (no 'checkpoint' state file naming an existing file)\n";
      return 1;
    }
    path = *latest;
  }

  loom::checkpoint_reader reader(path);
  if (o->print) {
    const loom::checkpoint_entry* e = reader.find(*o->print);
    if (!e) {
      std::cerr << "loom-ckpt: checkpoint " << path << " has no tensor '" << *o->print << "'\n";
      return 1;
    }
    print_tensor(*e, reader.read(*e), o->limit);
    return 0;
  }

  std::size_t name_width = 4;
  for (const auto& e : reader.entries())
    name_width = std::max(name_width, e.name.size());
  std::cout << "checkpoint " << path << " (format " << reader.version() << ", "
            << reader.entries().size() << " tensors, " << reader.file_size() << " bytes)\n";
  std::cout << std::left << std::setw(static_cast<int>(name_width)) << "name"
            << "  " << std::setw(8) << "dtype"
            << "  " << std::setw(16) << "shape"
            << "  " << std::right << std::setw(12) << "bytes"
            << "  checksum\n";
  std::size_t bad = 0;
  for (const auto& e : reader.entries()) {
    bad += e.crc_ok ? 0 : 1;
    std::cout << std::left << std::setw(static_cast<int>(name_width)) << e.name << "  "
              << std::setw(8) << to_string(e.type) << "  " << std::setw(16) << e.shape.to_string()
              << "  " << std::right << std::setw(12) << e.byte_length << "  "
              << (e.crc_ok ? "ok" : "BAD") << "\n";
  }
  if (bad) {
    std::cerr << "loom-ckpt: checkpoint " << path << " is corrupt: " << bad << " of "
              << reader.entries().size() << " tensors fail their checksum\n";
    return 1;
  }
  return 0;
} catch (const loom::error& e) {
  std::cerr << "loom-ckpt: " << e.what() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "loom-ckpt: " << e.what() << "\n";
  return 1;
}
