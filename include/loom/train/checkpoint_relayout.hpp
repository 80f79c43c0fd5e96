// How a checkpoint's variables map onto a graph's when the two partition them
// differently (train/saver.hpp restores through it): what the saver records of a
// partitioned variable beside its shards (partition_layout: how its ids spread, its
// shard count, axis and whole shape), what it saves of each variable
// (saved_variable), and how a shard restored into another count of shards takes
// each id's row from the saved shard that held it (loom's format), or from the
// whole (TF's, for a variable looked up with the "mod" strategy).
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tensor_bundle_reader.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::detail {

// How a partitioned variable's rows lie in its shards (from the attrs
// get_variable and embedding_lookup put on each shard): "mod" or "div" (TF's
// partition strategies), or "" where no lookup has said (a relayout then
// takes the other side's, or "div", contiguous ranges: the shards
// concatenated, as TF restores them), the shard count, the axis and
// the whole variable's shape. Saved beside the shards as the string tensor
// "<variable>/.partitioning", so that a restore into another count of
// shards can move each row to where it now belongs.
struct partition_layout {
  std::string strategy; // "mod", "div" or "" (not known)
  std::int64_t count = 1;
  std::int64_t axis = 0;
  loom::shape full;
  std::vector<std::string> shard_keys; // the shards' checkpoint keys, in order

  static std::string key(const std::string& variable) { return variable + "/.partitioning"; }
  // Where shard `index`, of shape `part`, lies in the whole (TF's save_slice_info):
  // its rows along the axis, every other dimension whole, each given as TF gives it.
  tensor_slice slice_of(std::int64_t index, const loom::shape& part) const;
  bool div() const noexcept { return strategy != "mod"; }

  any_tensor to_tensor() const;
  static partition_layout parse(const any_tensor& t, const std::string& where);
};

// The layout of a shard of a partitioned variable, from its node; nullopt for
// a variable that is not one.
LOOM_COMPILED_ONCE std::optional<partition_layout> layout_of(const node_def& n);

// Where a shard of a partitioned variable lies in the whole: the whole's shape
// and the shard's slice of it; nullopt for a variable that is not a shard.
LOOM_COMPILED_ONCE std::optional<std::pair<loom::shape, tensor_slice>> slice_of(const node_def& n);

// TF's shape_and_slice of a part: its save_slice_info spec, "10 4 0,4:0,4".
LOOM_COMPILED_ONCE std::string slice_spec(const loom::shape& full, const tensor_slice& slice);

struct saved_variable {
  std::string name; // its key in loom's format: the node's name (a mapped shard:
                    // "<whole>/part_<i>")
  // The variable it is saved as in TF's format: the node's name, or, for a shard of
  // a partitioned variable, the whole's and the shard's slice of it.
  std::string whole;
  std::optional<tensor_slice> slice;
  loom::shape whole_shape;
  node_id variable = no_node;
  node_id value = no_node;  // placeholder fed with the restored value
  node_id assign = no_node; // assigns it, colocated with the variable
  dtype type = dtype::f32;
  loom::shape shape;

  // TF's shape_and_slice of it: "" (whole) or the save_slice_info spec.
  std::string spec() const { return slice ? detail::slice_spec(whole_shape, *slice) : ""; }
};

// What the saver saves of variable n, under `name` ("": its own).
LOOM_COMPILED_ONCE saved_variable saved_variable_of(const node_def& n, const std::string& name);

// " (nearest: 'a', 'b', 'c')": up to three of `names` nearest to `name` by edit
// distance, for an error about a name that is not there.
LOOM_COMPILED_ONCE std::string nearest_of(std::string_view name, std::vector<std::string> names);

// Where a checkpoint lacks `name`, a hash table's shard variable ("<table>/part_<i>_of_<n>/..."),
// and holds the same table in another count of shards (among `names`): the error that says
// so, else "". A hash table's ids are routed to shards by the count, so its rows cannot be
// moved by position as a partitioned variable's are.
LOOM_COMPILED_ONCE std::string other_shard_count(const std::string& path, const std::string& name,
                                                 const std::vector<std::string>& names);

// The relayouts of one graph's variables (above): planned for each variable before
// anything is restored, so that every one is checked first, then carried out.
class checkpoint_relayout {
public:
  explicit checkpoint_relayout(const graph& g) : graph_(g) {}

  // The layout of a shard in this graph. A slot's strategy is its primary's
  // (a lookup may have said it after the slot was made).
  std::optional<partition_layout> layout_in_graph(const node_def& n) const;

  // The layout of every partitioned variable among `vars`, by its name, with
  // the checkpoint keys of its shards in order (a variable some of whose
  // shards this saver does not save gets no record).
  std::map<std::string, partition_layout>
  partitioned_layouts(const std::vector<saved_variable>& vars) const;

  // How to put a shard together from a checkpoint that laid its variable out
  // otherwise.
  struct relayout {
    std::string whole;                   // the partitioned variable
    partition_layout was, is;            // in the file, in the graph
    std::vector<std::string> saved_keys; // the file's shards, in order
    std::int64_t index = 0;              // this shard's, in the graph
    bool was_div = true, is_div = true;  // how ids spread, on each side
  };

  // nullopt where v is in the file as it is in the graph (or the file lacks
  // it: the caller's not-found error); checks what a relayout needs.
  std::optional<relayout> plan_relayout(const checkpoint_reader& reader, const std::string& path,
                                        const saved_variable& v) const;

  // The value of v, each row taken from the saved shard that held its id.
  // `saved` caches the saved shards of v's variable (read on first use).
  any_tensor relaid(const checkpoint_reader& reader, const relayout& r, const saved_variable& v,
                    std::vector<any_tensor>& saved) const;

  // How a shard looked up with "mod" takes its rows from a whole tensor that
  // holds the concatenation of `saved` "mod" shards (TF's format).
  struct mod_relayout {
    std::int64_t saved = 1; // shards, in the file
    std::int64_t count = 1; // shards, in the graph
    std::int64_t index = 0; // this shard's, in the graph
  };

  // nullopt where v's slice of the whole is its value: the file's and the
  // graph's partitionings agree, or ids spread "div" (contiguous ranges, which
  // is what slices are).
  std::optional<mod_relayout> plan_mod_relayout(const tensor_bundle::reader& reader,
                                                const tensor_bundle::entry& e,
                                                const saved_variable& v) const;

  any_tensor mod_relaid(const any_tensor& whole, const mod_relayout& r,
                        const saved_variable& v) const;

private:
  const graph& graph_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE auto partition_layout::slice_of(std::int64_t index,
                                                   const loom::shape& part) const -> tensor_slice {
  const std::int64_t size = full[axis];
  std::vector<std::int64_t> starts(static_cast<std::size_t>(part.rank()), 0);
  starts[static_cast<std::size_t>(axis)] = index * (size / count) + std::min(index, size % count);
  return tensor_slice(std::move(starts), part.dims());
}

LOOM_COMPILED_ONCE auto partition_layout::to_tensor() const -> any_tensor {
  std::string dims;
  for (std::int64_t d : full.dims())
    dims += (dims.empty() ? "" : ",") + std::to_string(d);
  std::vector<std::string> fields{"strategy=" + strategy, "count=" + std::to_string(count),
                                  "axis=" + std::to_string(axis), "shape=" + dims};
  for (const std::string& k : shard_keys)
    fields.push_back("shard=" + k);
  return any_tensor::from_vector<std::string>(loom::shape{static_cast<std::int64_t>(fields.size())},
                                              fields);
}

LOOM_COMPILED_ONCE auto partition_layout::parse(const any_tensor& t, const std::string& where)
    -> partition_layout {
  partition_layout l;
  auto bad = [&] {
    return data_loss_error(where + ": not a partitioning record (" + t.describe() + ")");
  };
  if (t.type() != dtype::string || t.num_elements() < 4)
    throw bad();
  const std::string* f = t.data<std::string>();
  auto value = [&](int i, const char* name) {
    const std::string prefix = std::string(name) + "=";
    if (f[i].rfind(prefix, 0) != 0)
      throw bad();
    return f[i].substr(prefix.size());
  };
  try {
    l.strategy = value(0, "strategy");
    l.count = std::stoll(value(1, "count"));
    l.axis = std::stoll(value(2, "axis"));
    std::vector<std::int64_t> dims;
    std::string rest = value(3, "shape");
    for (std::size_t at = 0; at < rest.size();) {
      const std::size_t comma = std::min(rest.find(',', at), rest.size());
      dims.push_back(std::stoll(rest.substr(at, comma - at)));
      at = comma + 1;
    }
    l.full = loom::shape(std::move(dims));
  } catch (const std::logic_error&) {
    throw bad();
  }
  if ((l.strategy != "mod" && l.strategy != "div" && !l.strategy.empty()) || l.count < 1 ||
      l.full.rank() < 1 || t.num_elements() != 4 + l.count)
    throw bad();
  for (std::int64_t p = 0; p < l.count; ++p)
    l.shard_keys.push_back(value(static_cast<int>(4 + p), "shard"));
  return l;
}

LOOM_COMPILED_ONCE std::optional<partition_layout> layout_of(const node_def& n) {
  if (!n.has_attr("_partition_of"))
    return std::nullopt;
  return partition_layout{n.attr_or<std::string>("_partition_strategy", ""),
                          n.attr<std::int64_t>("_partition_count"),
                          n.attr<std::int64_t>("_partition_axis"),
                          loom::shape(n.attr<std::vector<std::int64_t>>("_partition_full_shape")),
                          {}};
}

LOOM_COMPILED_ONCE std::optional<std::pair<loom::shape, tensor_slice>> slice_of(const node_def& n) {
  const auto layout = layout_of(n);
  if (!layout)
    return std::nullopt;
  return std::pair(layout->full,
                   layout->slice_of(n.attr<std::int64_t>("_partition_index"), n.shape));
}

LOOM_COMPILED_ONCE std::string slice_spec(const loom::shape& full, const tensor_slice& slice) {
  std::string out;
  for (std::int64_t d : full.dims())
    out += std::to_string(d) + " ";
  return out + slice.to_string();
}

LOOM_COMPILED_ONCE saved_variable saved_variable_of(const node_def& n, const std::string& name) {
  saved_variable v;
  v.variable = n.id;
  v.type = n.type;
  v.shape = n.shape;
  v.whole_shape = n.shape;
  const auto part = slice_of(n);
  v.whole = !name.empty() ? name : part ? n.attr<std::string>("_partition_of") : n.name;
  v.name = name.empty() ? n.name : v.whole;
  if (part) {
    std::tie(v.whole_shape, v.slice) = *part;
    if (!name.empty())
      v.name = v.whole + "/part_" + std::to_string(n.attr<std::int64_t>("_partition_index"));
  }
  return v;
}

LOOM_COMPILED_ONCE std::string nearest_of(std::string_view name, std::vector<std::string> names) {
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    return tensor_bundle::detail::edit_distance(name, a) <
           tensor_bundle::detail::edit_distance(name, b);
  });
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 3; ++i)
    out += (i ? ", '" : " (nearest: '") + names[i] + "'";
  return out.empty() ? " (there are none)" : out + ")";
}

LOOM_COMPILED_ONCE std::string other_shard_count(const std::string& path, const std::string& name,
                                                 const std::vector<std::string>& names) {
  // "<table>/part_<i>_of_<n>/<rest>": its table and its count.
  auto parse = [](const std::string& s) -> std::optional<std::pair<std::string, std::string>> {
    const std::size_t part = s.find("/part_");
    const std::size_t of = part == std::string::npos ? part : s.find("_of_", part);
    const std::size_t end = of == std::string::npos ? of : s.find('/', of);
    if (end == std::string::npos)
      return std::nullopt;
    return std::pair(s.substr(0, part), s.substr(of + 4, end - of - 4));
  };
  const auto wanted = parse(name);
  if (!wanted)
    return "";
  for (const std::string& other : names)
    if (const auto saved = parse(other);
        saved && saved->first == wanted->first && saved->second != wanted->second)
      return "checkpoint " + path + ": hash embedding '" + wanted->first + "' was saved in " +
             saved->second + " shards and has " + wanted->second +
             " here: a hash table restores only into the shard count it was saved with (its "
             "ids are routed to shards by the count)";
  return "";
}

LOOM_COMPILED_ONCE auto checkpoint_relayout::layout_in_graph(const node_def& n) const
    -> std::optional<partition_layout> {
  auto layout = layout_of(n);
  if (layout && n.has_attr("_partition_primary"))
    if (const auto primary = graph_.try_find(n.attr<std::string>("_partition_primary")))
      layout->strategy =
          graph_.node(*primary).attr_or<std::string>("_partition_strategy", layout->strategy);
  return layout;
}

LOOM_COMPILED_ONCE auto
checkpoint_relayout::partitioned_layouts(const std::vector<saved_variable>& vars) const
    -> std::map<std::string, partition_layout> {
  std::map<std::string, partition_layout> out;
  for (const auto& v : vars) {
    const node_def& n = graph_.node(v.variable);
    const auto layout = layout_in_graph(n);
    if (!layout)
      continue;
    auto [it, fresh] = out.try_emplace(v.whole, *layout);
    if (fresh)
      it->second.shard_keys.assign(static_cast<std::size_t>(layout->count), "");
    const auto index = static_cast<std::size_t>(n.attr<std::int64_t>("_partition_index"));
    if (index < it->second.shard_keys.size())
      it->second.shard_keys[index] = v.name;
  }
  std::erase_if(out, [](const auto& kv) {
    const auto& keys = kv.second.shard_keys;
    return std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.empty(); });
  });
  return out;
}

LOOM_COMPILED_ONCE auto checkpoint_relayout::plan_relayout(const checkpoint_reader& reader,
                                                           const std::string& path,
                                                           const saved_variable& v) const
    -> std::optional<relayout> {
  const node_def& node = graph_.node(v.variable);
  const auto now = layout_in_graph(node);
  relayout r;
  r.whole = v.whole;
  const checkpoint_entry* record = reader.find(partition_layout::key(r.whole));
  if (!now && !record)
    return std::nullopt; // neither side partitioned
  const std::string where = "checkpoint " + path + ", variable '" + r.whole + "'";
  if (record) {
    r.was = partition_layout::parse(reader.read(*record), where);
    r.saved_keys = r.was.shard_keys;
  } else { // saved whole
    const checkpoint_entry* e = reader.find(r.whole);
    if (!e)
      return std::nullopt; // the shards by their own names, or not found
    r.was.full = e->shape;
    r.saved_keys = {r.whole};
  }
  r.is = now ? *now : partition_layout{r.was.strategy, 1, 0, v.shape, {}};
  const bool both_said = !r.was.strategy.empty() && !r.is.strategy.empty();
  if (r.was.count == r.is.count && r.was.axis == r.is.axis &&
      (r.was.count == 1 || !both_said || r.was.strategy == r.is.strategy))
    return std::nullopt; // the same layout (as far as both know): each shard as saved
  if (!(r.was.full == r.is.full))
    throw invalid_argument_error(where + " was saved with shape " + r.was.full.to_string() +
                                 ", the graph's has " + r.is.full.to_string());
  if ((r.was.count > 1 && r.was.axis != 0) || (r.is.count > 1 && r.is.axis != 0))
    throw unimplemented_error(where +
                              ": only variables partitioned along axis 0 restore into "
                              "another count of shards (saved along axis " +
                              std::to_string(r.was.axis) + ", now " + std::to_string(r.is.axis) +
                              ")");
  if (r.was.count > 1 && r.is.count > 1 && both_said && r.was.strategy != r.is.strategy)
    throw invalid_argument_error(
        where + " was saved in " + std::to_string(r.was.count) + " shards spread by the \"" +
        r.was.strategy + "\" strategy, and is now looked up with \"" + r.is.strategy + "\" over " +
        std::to_string(r.is.count) +
        " shards: its rows would change ids (look it up with the strategy it was saved with)");
  if (v.type == dtype::string)
    throw unimplemented_error(where + ": string variables do not restore into another count "
                                      "of shards");
  // How ids spread: as the side that says (both agree where both do), else
  // "div" (the shards concatenated).
  const std::string said = r.is.count > 1 && !r.is.strategy.empty() ? r.is.strategy
                           : r.was.count > 1                        ? r.was.strategy
                                                                    : r.is.strategy;
  r.was_div = r.is_div = said != "mod";
  r.index = now ? node.attr<std::int64_t>("_partition_index") : 0;
  for (std::size_t p = 0; p < r.saved_keys.size(); ++p) {
    const checkpoint_entry* e = reader.find(r.saved_keys[p]);
    const std::int64_t rows =
        shard_rows(static_cast<std::int64_t>(p), r.was.count, r.was.full[0], r.was_div);
    if (!e)
      throw not_found_error(where + ": no tensor '" + r.saved_keys[p] + "' (shard " +
                            std::to_string(p) + " of " + std::to_string(r.was.count) + ")");
    if (e->type != v.type)
      throw invalid_argument_error(where + ": tensor '" + r.saved_keys[p] + "' is " +
                                   std::string(to_string(e->type)) + ", the variable is " +
                                   std::string(to_string(v.type)));
    if (e->shape.rank() != r.was.full.rank() || e->shape[0] != rows ||
        e->shape.num_elements() * r.was.full[0] != rows * r.was.full.num_elements())
      throw data_loss_error(where + ": tensor '" + r.saved_keys[p] + "' has shape " +
                            e->shape.to_string() + ", not that of shard " + std::to_string(p) +
                            " of " + r.was.full.to_string());
  }
  return r;
}

LOOM_COMPILED_ONCE auto checkpoint_relayout::relaid(const checkpoint_reader& reader,
                                                    const relayout& r, const saved_variable& v,
                                                    std::vector<any_tensor>& saved) const
    -> any_tensor {
  if (saved.empty())
    for (const std::string& key : r.saved_keys)
      saved.push_back(reader.read(*reader.find(key)));
  const std::int64_t rows = r.is.full[0];
  const auto width = static_cast<std::size_t>(rows == 0 ? 0 : r.is.full.num_elements() / rows);
  const std::size_t row_bytes = width * size_of(v.type);
  any_tensor out(v.type, v.shape);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (std::int64_t row = 0; row < v.shape[0]; ++row) {
    const std::int64_t id = id_at(r.index, row, r.is.count, rows, r.is_div);
    const auto from = route_id(id, r.was.count, rows, r.was_div);
    const auto* src =
        static_cast<const std::byte*>(saved[static_cast<std::size_t>(from.shard)].raw_data());
    std::memcpy(dst + static_cast<std::size_t>(row) * row_bytes,
                src + static_cast<std::size_t>(from.row) * row_bytes, row_bytes);
  }
  return out;
}

LOOM_COMPILED_ONCE auto checkpoint_relayout::plan_mod_relayout(const tensor_bundle::reader& reader,
                                                               const tensor_bundle::entry& e,
                                                               const saved_variable& v) const
    -> std::optional<mod_relayout> {
  const node_def& node = graph_.node(v.variable);
  const auto now = layout_in_graph(node);
  mod_relayout r;
  r.count = now ? now->count : 1;
  r.index = now ? node.attr<std::int64_t>("_partition_index") : 0;
  r.saved = e.partitioned() ? static_cast<std::int64_t>(e.slices.size()) : 1;
  std::string was; // the strategy the saver recorded, if it was loom's
  if (const tensor_bundle::entry* record = reader.find(partition_layout::key(v.whole));
      record && record->type() == dtype::string)
    was = partition_layout::parse(reader.read_tensor(record->key),
                                  "checkpoint " + reader.prefix() + ", variable '" + v.whole + "'")
              .strategy;
  const std::string is = now ? now->strategy : "";
  const std::string where = "checkpoint " + reader.prefix() + ", variable '" + v.whole + "'";
  if (r.saved > 1 && r.count > 1 && !was.empty() && !is.empty() && was != is)
    throw invalid_argument_error(
        where + " was saved in " + std::to_string(r.saved) + " shards spread by the \"" + was +
        "\" strategy, and is now looked up with \"" + is + "\" over " + std::to_string(r.count) +
        " shards: its rows would change ids (look it up with the strategy it was saved with)");
  const std::string said = r.count > 1 && !is.empty() ? is : r.saved > 1 ? was : is;
  if (r.saved == r.count || said != "mod")
    return std::nullopt;
  // The saved parts must be get_variable's: along axis 0, in its sizes.
  const std::int64_t rows = e.shape.rank() > 0 ? e.shape[0] : 0;
  bool as_made = (!now || now->axis == 0) && v.type != dtype::string;
  for (const tensor_slice& part : e.slices)
    for (int d = 1; d < part.rank(); ++d)
      as_made = as_made && part.begin(d) == 0 && part.end_in(e.shape, d) == e.shape[d];
  for (std::int64_t p = 0; as_made && p < r.saved && e.partitioned(); ++p) {
    const std::int64_t begin = p * (rows / r.saved) + std::min(p, rows % r.saved);
    as_made = std::any_of(e.slices.begin(), e.slices.end(), [&](const tensor_slice& part) {
      return part.begin(0) == begin &&
             part.end_in(e.shape, 0) - begin == shard_rows(p, r.saved, rows, true);
    });
  }
  if (!as_made)
    throw unimplemented_error(where + ": a variable looked up with the \"mod\" strategy "
                                      "restores into another count of shards only from numeric "
                                      "parts split along axis 0 as get_variable splits them");
  return r;
}

LOOM_COMPILED_ONCE auto checkpoint_relayout::mod_relaid(const any_tensor& whole,
                                                        const mod_relayout& r,
                                                        const saved_variable& v) const
    -> any_tensor {
  const std::int64_t rows = v.whole_shape[0];
  const auto width = static_cast<std::size_t>(rows == 0 ? 0 : v.whole_shape.num_elements() / rows);
  const std::size_t row_bytes = width * size_of(v.type);
  any_tensor out(v.type, v.shape);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  const auto* src = static_cast<const std::byte*>(whole.raw_data());
  for (std::int64_t row = 0; row < v.shape[0]; ++row) {
    const std::int64_t id = id_at(r.index, row, r.count, rows, false);
    const auto from = route_id(id, r.saved, rows, false);
    const std::int64_t at = id_at(from.shard, from.row, r.saved, rows, true);
    std::memcpy(dst + static_cast<std::size_t>(row) * row_bytes,
                src + static_cast<std::size_t>(at) * row_bytes, row_bytes);
  }
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
