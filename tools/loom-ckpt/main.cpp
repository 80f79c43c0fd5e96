// loom-ckpt: lists the tensors of a checkpoint and prints their values (TF's
// inspect_checkpoint), of loom's own format or of TensorFlow's (V2, the tensor
// bundle: PREFIX.index and PREFIX.data-*, core/tensor_bundle.hpp), whichever the path
// names.
//
//   loom-ckpt /tmp/train/model-1000          name, dtype, shape, bytes, checksum; and
//                                            the rows of each hash-table shard holding ids
//                                            (of an increment: its link and rows written)
//   loom-ckpt /tmp/train                     the directory's latest checkpoint
//   loom-ckpt /tmp/train --print hid/w --limit 50
//   loom-ckpt inspect /tmp/tf/model.ckpt-3   a TF checkpoint: also each partitioned
//   loom-ckpt inspect /tmp/tf/model.ckpt-3 --tensor emb    tensor's slices
//   loom-ckpt convert /tmp/train/model-1000 /tmp/tf/model.ckpt-1000   into TF's format
//
// Exits 0 when the file is sound, 1 when it is missing, truncated or corrupt
// (a bad checksum included), 2 on a usage error.
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/kernels/cpu/count_min_sketch.hpp>
#include <loom/train/incremental_saver.hpp>
#include <loom/train/saver.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage =
    "usage: loom-ckpt [inspect] <checkpoint or directory> [--tensor NAME] [--limit N]\n"
    "  Lists the tensors of a checkpoint, loom's or TensorFlow's (a prefix with a .index\n"
    "  file), and checks their checksums (a directory means its latest checkpoint);\n"
    "  --tensor (or --print) prints one tensor's first N values (default 20).\n"
    "usage: loom-ckpt convert <checkpoint> <TF checkpoint prefix>\n"
    "  Writes a checkpoint, loom's or TensorFlow's, in TensorFlow's format (V2), which\n"
    "  TensorFlow restores; a partitioned tensor keeps its slices.\n";

struct options {
  bool convert = false;
  std::string path;
  std::string to; // convert's destination
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
    if (i == 1 && (arg == "inspect" || arg == "convert") && argc > 2) {
      o.convert = arg == "convert";
      continue;
    }
    if (auto v = value("--print")) {
      o.print = *v;
    } else if (auto t = value("--tensor")) {
      o.print = *t;
    } else if (auto n = value("--limit")) {
      std::int64_t limit = 0;
      auto [end, ec] = std::from_chars(n->data(), n->data() + n->size(), limit);
      if (ec != std::errc() || end != n->data() + n->size() || limit < 0) {
        std::cerr << "loom-ckpt: --limit needs a number >= 0, not '" << *n << "'\n" << usage;
        code = 2;
        return std::nullopt;
      }
      o.limit = limit;
    } else if (o.convert && !o.path.empty() && o.to.empty() && arg.rfind("--", 0) != 0) {
      o.to = std::string(arg);
    } else if (arg.rfind("--", 0) == 0 || !o.path.empty()) {
      std::cerr << "loom-ckpt: unexpected argument '" << arg << "'\n" << usage;
      code = 2;
      return std::nullopt;
    } else {
      o.path = std::string(arg);
    }
  }
  if (o.path.empty() || (o.convert && (o.to.empty() || o.print))) {
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

void print_tensor(const std::string& name, const loom::any_tensor& t, std::int64_t limit) {
  std::ostringstream out;
  out << name << ": " << t.describe() << " = [";
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

// Hash-table embeddings' shards (graph/hash_embedding.hpp: "<shard>/keys", int64
// [capacity], -1 where a row holds no id, beside "<shard>/rows"): the rows holding ids, and
// where the checkpoint holds them, the rows of the shard's disk tier
// (train/disk_tier_checkpoint.hpp) and the ids its admission counts say wait
// (train/state_checkpoint.hpp).
void print_hash_tables(const std::vector<std::string>& names,
                       const std::function<loom::any_tensor(const std::string&)>& read) {
  const std::set<std::string> all(names.begin(), names.end());
  bool first = true;
  for (const std::string& name : names) {
    const std::string suffix = "/keys";
    if (!name.ends_with(suffix))
      continue;
    const std::string shard = name.substr(0, name.size() - suffix.size());
    if (all.count(shard + "/rows") == 0 || shard.find("/.") != std::string::npos)
      continue; // not a shard (a disk tier's ids are "<rows>/.disk_tier/keys")
    const loom::any_tensor keys = read(name);
    if (keys.type() != loom::dtype::i64 || keys.shape().rank() != 1)
      continue;
    const std::int64_t* k = keys.data<std::int64_t>();
    const auto held =
        std::count_if(k, k + keys.num_elements(), [](std::int64_t v) { return v >= 0; });
    std::string more;
    if (const std::string tier = loom::detail::disk_tier_checkpoint::key(shard + "/rows", "keys");
        all.count(tier))
      more += ", " + std::to_string(read(tier).num_elements()) + " on disk";
    if (const std::string counts = loom::detail::state_checkpoint::admission_key(name);
        all.count(counts))
      if (const auto saved =
              loom::kernels::saved_admission_counts::decode(read(counts).data<std::string>()[0]))
        more += ", about " + std::to_string(saved->first.waiting(saved->second)) +
                " waiting for admission";
    if (first)
      std::cout << "hash-table shards: rows holding ids, of the capacity\n";
    first = false;
    std::cout << "  " << shard << ": " << held << " of " << keys.num_elements() << more << "\n";
  }
}

// An incremental checkpoint (train/incremental_saver.hpp): its place in its chain, and
// the rows of each hash-table shard it holds.
void print_increment(const loom::checkpoint_reader& r) {
  auto text = [&](const char* key) { return r.read_tensor(key).data<std::string>()[0]; };
  std::cout << "incremental checkpoint: link "
            << r.read_tensor(loom::detail::increment_sequence_key).data<std::int64_t>()[0]
            << " of the chain based on " << text(loom::detail::increment_base_key)
            << " (previous: " << text(loom::detail::increment_previous_key) << ")\n";
  const std::string suffix = "/.changed_rows";
  bool first = true;
  for (const auto& e : r.entries()) {
    if (!e.name.ends_with(suffix))
      continue;
    if (first)
      std::cout << "hash-table shards: rows written since the previous save\n";
    first = false;
    const std::string rows = e.name.substr(0, e.name.size() - suffix.size());
    std::cout << "  " << rows.substr(0, rows.size() - std::string("/rows").size()) << ": "
              << e.shape.num_elements() << "\n";
  }
}

// A TF checkpoint: its tensors (a partitioned one with its slices), each read to check
// its checksum; exit 1 where one fails it.
int inspect_tf(const std::string& prefix, const options& o) {
  namespace tb = loom::tensor_bundle;
  const tb::reader reader(prefix);
  if (o.print) { // a name it lacks: a not_found_error listing the nearest
    print_tensor(*o.print, reader.read_tensor(*o.print), o.limit);
    return 0;
  }
  const auto entries = reader.entries();
  std::size_t name_width = 4;
  for (const tb::entry* e : entries)
    name_width = std::max(name_width, e->key.size());
  std::cout << "TensorFlow checkpoint " << prefix << " (" << entries.size() << " tensors, "
            << reader.num_shards() << " data file" << (reader.num_shards() == 1 ? "" : "s")
            << ")\n";
  std::cout << std::left << std::setw(static_cast<int>(name_width)) << "name"
            << "  " << std::setw(8) << "dtype"
            << "  " << std::setw(16) << "shape"
            << "  " << std::right << std::setw(12) << "bytes"
            << "  checksum  slices\n";
  std::vector<std::string> bad;
  for (const tb::entry* e : entries) {
    std::uint64_t bytes = e->size;
    for (const loom::tensor_slice& s : e->slices)
      bytes += reader.find_part(e->key, s)->size;
    std::string checksum = "ok";
    if (!e->type()) {
      checksum = "-"; // a dtype loom lacks: not read
    } else {
      try {
        reader.read_tensor(e->key);
      } catch (const loom::data_loss_error& err) {
        checksum = "BAD";
        bad.push_back(err.message());
      } catch (const loom::not_found_error& err) {
        checksum = "BAD";
        bad.push_back(err.message()); // a data file is missing
      }
    }
    std::string slices;
    for (const loom::tensor_slice& s : e->slices)
      slices += (slices.empty() ? "" : " ") + s.to_string();
    std::ostringstream row;
    row << std::left << std::setw(static_cast<int>(name_width)) << e->key << "  " << std::setw(8)
        << e->dtype_name() << "  " << std::setw(16) << e->shape.to_string() << "  " << std::right
        << std::setw(12) << bytes << "  " << std::left << std::setw(8) << checksum << "  "
        << slices;
    std::string text = row.str();
    text.erase(text.find_last_not_of(' ') + 1);
    std::cout << text << "\n";
  }
  for (const std::string& b : bad)
    std::cerr << "loom-ckpt: " << b << "\n";
  if (bad.empty()) {
    std::vector<std::string> names;
    for (const tb::entry* e : entries)
      names.push_back(e->key);
    print_hash_tables(names, [&](const std::string& n) { return reader.read_tensor(n); });
  }
  if (!bad.empty()) {
    std::cerr << "loom-ckpt: checkpoint " << prefix << " is corrupt: " << bad.size() << " of "
              << entries.size() << " tensors fail to read\n";
    return 1;
  }
  return 0;
}

bool is_tf_checkpoint(const std::string& prefix) {
  std::error_code ec;
  return std::filesystem::is_regular_file(loom::tensor_bundle::index_path(prefix), ec);
}

// Writes checkpoint `from` (either format) as TF checkpoint `to`: a TF checkpoint's
// tensors into the data files they were in, a loom checkpoint's into one.
int convert(const std::string& from, const std::string& to) {
  namespace tb = loom::tensor_bundle;
  std::vector<std::vector<tb::tensor_to_save>> shards(1);
  std::size_t count = 0;
  if (is_tf_checkpoint(from)) {
    const tb::reader reader(from);
    shards.resize(static_cast<std::size_t>(reader.num_shards()));
    auto add = [&](const tb::entry& stored, tb::tensor_to_save t) {
      shards[static_cast<std::size_t>(stored.shard_id)].push_back(std::move(t));
    };
    for (const tb::entry* e : reader.entries()) {
      if (!e->type()) {
        std::cerr << "loom-ckpt: not converted: '" << e->key << "' (" << e->dtype_name()
                  << ", a dtype loom lacks)\n";
        continue;
      }
      ++count;
      if (!e->partitioned())
        add(*e, {e->key, reader.read_tensor(e->key), {}, {}});
      for (const loom::tensor_slice& s : e->slices)
        add(*reader.find_part(e->key, s), {e->key, reader.read_slice(e->key, s), s, e->shape});
    }
  } else {
    const loom::checkpoint_reader reader(from);
    // A partitioned variable's shards become its slices of the whole, as TF saves
    // them (its "<var>/.partitioning" record names them and says how).
    std::map<std::string, std::pair<std::string, loom::detail::partition_layout>> shard_of;
    for (const loom::checkpoint_entry& e : reader.entries()) {
      const std::string suffix = "/.partitioning";
      if (e.name.size() <= suffix.size() || !e.name.ends_with(suffix))
        continue;
      const std::string whole = e.name.substr(0, e.name.size() - suffix.size());
      const auto layout = loom::detail::partition_layout::parse(
          reader.read(e), "checkpoint " + from + ", variable '" + whole + "'");
      for (const std::string& key : layout.shard_keys)
        shard_of[key] = {whole, layout};
    }
    for (const loom::checkpoint_entry& e : reader.entries()) {
      if (e.name == loom::detail::checkpoint_shards_key) // a sharded checkpoint's list of files
        continue;
      loom::any_tensor value = reader.read(e);
      ++count;
      const auto it = shard_of.find(e.name);
      if (it == shard_of.end()) {
        shards[0].push_back({e.name, std::move(value), {}, {}});
        continue;
      }
      const auto& [whole, layout] = it->second;
      const auto index = static_cast<std::int64_t>(
          std::find(layout.shard_keys.begin(), layout.shard_keys.end(), e.name) -
          layout.shard_keys.begin());
      loom::tensor_slice slice = layout.slice_of(index, value.shape());
      shards[0].push_back({whole, std::move(value), std::move(slice), layout.full});
    }
  }
  const int num_shards = static_cast<int>(shards.size());
  std::vector<tb::entry> entries;
  for (int i = 0; i < num_shards; ++i) {
    const auto& mine = shards[static_cast<std::size_t>(i)];
    auto written =
        tb::write_shard(to, i, num_shards, mine.size(), [&](std::size_t k) { return mine[k]; });
    entries.insert(entries.end(), written.begin(), written.end());
  }
  tb::write_index(to, num_shards, std::move(entries));
  std::cout << "wrote " << count << " tensors to TensorFlow checkpoint " << to << " (" << num_shards
            << " data file" << (num_shards == 1 ? "" : "s") << ")\n";
  return 0;
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

  if (o->convert)
    return convert(o->path, o->to);

  std::string path = o->path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // TF's state file names a prefix, which is no file of its own.
    if (const auto state = loom::get_checkpoint_state(path);
        state && is_tf_checkpoint(state->model_checkpoint_path))
      return inspect_tf(state->model_checkpoint_path, *o);
    auto latest = loom::latest_checkpoint(path);
    if (!latest) {
      std::cerr << "loom-ckpt: directory " << path
                << " has no checkpoint (no 'checkpoint' state file naming an existing file)\n";
      return 1;
    }
    path = *latest;
  }

  if (is_tf_checkpoint(path))
    return inspect_tf(path, *o);

  loom::checkpoint_reader reader(path);
  if (o->print) {
    const loom::checkpoint_entry* e = reader.find(*o->print);
    if (!e) {
      std::cerr << "loom-ckpt: checkpoint " << path << " has no tensor '" << *o->print << "'\n";
      return 1;
    }
    print_tensor(e->name, reader.read(*e), o->limit);
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
  if (reader.has_tensor(loom::detail::increment_sequence_key)) {
    print_increment(reader);
    return 0;
  }
  std::vector<std::string> names;
  for (const auto& e : reader.entries())
    names.push_back(e.name);
  print_hash_tables(names, [&](const std::string& n) { return reader.read(*reader.find(n)); });
  return 0;
} catch (const loom::error& e) {
  std::cerr << "loom-ckpt: " << e.what() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "loom-ckpt: " << e.what() << "\n";
  return 1;
}
