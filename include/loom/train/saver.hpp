// Checkpoints (TF's tf.train.Saver, tf.train.latest_checkpoint and
// tf.train.NewCheckpointReader).
//
//   loom::saver saver(g);                                  // the global variables
//   std::string path = saver.save(sess, dir + "/model", step);  // dir/model-<step>
//   saver.restore(sess, *loom::latest_checkpoint(dir));
//
// A saver saves variables by node name (TF's checkpoint key), every one in one
// session run, and restores them with one run that feeds a placeholder per
// variable into an assign. The assign and its placeholder are colocated with
// their variable, so on a cluster each value goes straight to the variable's ps
// task, and a checkpoint restores into a cluster with another number of ps
// tasks (the names, not the devices, identify the variables).
//
// Sharded (saver_options::sharded, TF's Saver(sharded=True)): each task
// writes its own variables to its shard file in the same run, in parallel,
// and no saved byte crosses the network; the saver then writes the manifest
// that names the shards, last, so a checkpoint is whole or absent. The tasks
// and the saver must see one filesystem at the same path (TF's assumption
// too: a shared or network filesystem across hosts). A restore reads either
// kind (checkpoint_reader opens a manifest's shards).
//
// Beside the variables, the position of each iterator of the graph
// (train/iterator_checkpoint.hpp): save() writes it, restore() puts it back.
//
// The file's format: core/checkpoint_format.hpp; the directory's state
// file: train/checkpoint_state.hpp; both written durably (durable_file.hpp).
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/train/iterator_checkpoint.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace loom {

namespace detail {

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
  bool div() const noexcept { return strategy != "mod"; }

  any_tensor to_tensor() const {
    std::string dims;
    for (std::int64_t d : full.dims())
      dims += (dims.empty() ? "" : ",") + std::to_string(d);
    std::vector<std::string> fields{"strategy=" + strategy, "count=" + std::to_string(count),
                                    "axis=" + std::to_string(axis), "shape=" + dims};
    for (const std::string& k : shard_keys)
      fields.push_back("shard=" + k);
    return any_tensor::from_vector<std::string>(
        loom::shape{static_cast<std::int64_t>(fields.size())}, fields);
  }
  static partition_layout parse(const any_tensor& t, const std::string& where) {
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
};

// The layout of a shard of a partitioned variable, from its node; nullopt for
// a variable that is not one.
inline std::optional<partition_layout> layout_of(const node_def& n) {
  if (!n.has_attr("_partition_of"))
    return std::nullopt;
  return partition_layout{n.attr_or<std::string>("_partition_strategy", ""),
                          n.attr<std::int64_t>("_partition_count"),
                          n.attr<std::int64_t>("_partition_axis"),
                          loom::shape(n.attr<std::vector<std::int64_t>>("_partition_full_shape")),
                          {}};
}

} // namespace detail

struct saver_options {
  // Checkpoints kept on disk; older ones are deleted. 0 or less keeps every
  // file and lists only the newest in the state file (TF's max_to_keep=None).
  int max_to_keep = 5;
  // Variable nodes to save; empty: the global_variables collection.
  std::vector<node_id> var_list{};
  // Each task writes its own variables' shard of the checkpoint (above).
  bool sharded = false;
};

class saver {
public:
  // What the saver saves, and the nodes that restore it.
  struct saved_variable {
    std::string name; // the checkpoint key: the variable node's name
    node_id variable = no_node;
    node_id value = no_node;  // placeholder fed with the restored value
    node_id assign = no_node; // assigns it, colocated with the variable
    dtype type = dtype::f32;
    loom::shape shape;
  };

  explicit saver(graph& g, saver_options o = {}) : graph_(g), max_to_keep_(o.max_to_keep) {
    std::vector<node_id> ids =
        o.var_list.empty() ? g.collection(collection::global_variables) : o.var_list;
    if (ids.empty())
      throw invalid_argument_error("saver: no variables to save");
    for (node_id id : ids) // every id checked before the graph changes
      if (g.node(id).op != "variable")
        throw invalid_argument_error("saver: node " + g.node(id).describe() + " is not a variable");
    // The restore nodes take no name scope, device scope or control dependency
    // of wherever the saver is made.
    auto no_names = g.name_scope("");
    auto no_deps = g.control_dependencies(nullptr);
    auto no_device = g.device(nullptr);
    iterators_ = detail::iterator_checkpoint(g);
    auto names = g.name_scope("save");
    for (node_id id : ids) {
      const node_def& n = g.node(id);
      if (std::any_of(vars_.begin(), vars_.end(), [&](auto& v) { return v.variable == id; }))
        continue;
      saved_variable v{n.name, id, no_node, no_node, n.type, n.shape};
      v.value =
          g.add_node("placeholder", {}, {{"dtype", v.type}, {"shape", v.shape}}, v.name + "/value");
      // Fed on the variable's task: the value crosses the network once.
      g.mutable_node(v.value).colocation_group = g.node(id).colocation();
      v.assign = g.add_node("assign", {id, v.value}, {}, v.name + "/assign");
      vars_.push_back(std::move(v));
    }
    if (o.sharded)
      add_shard_writers(g);
  }

  // Saves every variable (fetched in one run) to `prefix` or, with a global
  // step, to "prefix-<step>"; updates the directory's state file and deletes
  // the checkpoints beyond max_to_keep. Returns the path written.
  std::string save(session& s, const std::string& prefix,
                   std::optional<std::int64_t> global_step = {}) {
    check_session(s);
    if (prefix.empty())
      throw invalid_argument_error("saver::save: empty checkpoint prefix");
    const std::string path = global_step ? prefix + "-" + std::to_string(*global_step) : prefix;
    // The layout of each partitioned variable, once, beside its shards.
    std::vector<std::pair<std::string, any_tensor>> records;
    for (const auto& [whole, layout] : partitioned_layouts())
      records.emplace_back(detail::partition_layout::key(whole), layout.to_tensor());
    for (auto& position : iterators_.save(s))
      records.push_back(std::move(position));
    if (!shard_writers_.empty())
      save_sharded(s, path, std::move(records));
    else
      save_one_file(s, path, std::move(records));
    record_saved(path);
    return path;
  }

private:
  void save_one_file(
      session& s, const std::string& path,
      std::vector<std::pair<std::string, any_tensor>>
          records) { // Fetched in groups of at most group_bytes, each in one run, and written
    // as they come: a model larger than a message or than this process's
    // memory saves in pieces. (Each group is one snapshot; in async training
    // other workers may update between groups, as between TF's SaveV2 reads.)
    std::vector<any_tensor> group;
    std::size_t group_begin = 0;
    write_checkpoint_file(path, vars_.size() + records.size(), [&](std::size_t i) {
      if (i >= vars_.size())
        return std::move(records[i - vars_.size()]);
      if (i >= group_begin + group.size()) {
        group_begin = i;
        std::vector<node_id> ids;
        std::size_t bytes = 0;
        for (std::size_t j = i;
             j < vars_.size() && (j == i || bytes + bytes_of(vars_[j]) <= group_bytes); ++j) {
          ids.push_back(vars_[j].variable);
          bytes += bytes_of(vars_[j]);
        }
        group = s.run_nodes(ids, {});
        for (std::size_t k = 0; k < group.size(); ++k) {
          const saved_variable& v = vars_[group_begin + k];
          if (group[k].type() != v.type || !(group[k].shape() == v.shape))
            throw internal_error("saver: variable '" + v.name + "' is " + group[k].describe() +
                                 ", its node says " + std::string(to_string(v.type)) +
                                 v.shape.to_string());
        }
      }
      return std::pair<std::string, any_tensor>(vars_[i].name, std::move(group[i - group_begin]));
    });
  }

  // Every task writes its shard in one run; then the manifest, last.
  void save_sharded(session& s, const std::string& path,
                    std::vector<std::pair<std::string, any_tensor>> records) {
    remove_shard_files(path); // what an interrupted save with this name left
    s.run_nodes({}, shard_writers_, {{filename_, any_tensor::scalar<std::string>(path)}});
    std::vector<std::string> names;
    for (std::size_t i = 0; i < shard_writers_.size(); ++i)
      names.push_back(std::filesystem::path(
                          checkpoint_shard_path(path, static_cast<std::int64_t>(i),
                                                static_cast<std::int64_t>(shard_writers_.size())))
                          .filename()
                          .string());
    records.emplace_back(std::string(checkpoint_shards_key),
                         any_tensor::from_vector<std::string>(
                             loom::shape{static_cast<std::int64_t>(names.size())}, names));
    write_checkpoint_file(path, records.size(),
                          [&](std::size_t i) { return std::move(records[i]); });
  }

  // One shard writer per task that holds variables: the variables grouped by
  // the device their colocation group asked for (a slot goes with its
  // variable), each group's writer colocated with its first variable.
  void add_shard_writers(graph& g) {
    std::vector<std::string> devices;
    std::vector<std::vector<const saved_variable*>> groups;
    for (const auto& v : vars_) {
      const node_def& n = g.node(v.variable);
      const auto root = g.try_find(n.colocation());
      const std::string device = root ? g.node(*root).requested_device : n.requested_device;
      auto it = std::find(devices.begin(), devices.end(), device);
      if (it == devices.end()) {
        devices.push_back(device);
        groups.emplace_back();
        it = devices.end() - 1;
      }
      groups[static_cast<std::size_t>(it - devices.begin())].push_back(&v);
    }
    filename_ = g.add_node("placeholder", {}, {{"dtype", dtype::string}, {"shape", loom::shape{}}},
                           "filename");
    for (std::size_t i = 0; i < groups.size(); ++i) {
      std::vector<node_id> inputs{filename_};
      std::vector<std::string> names;
      for (const saved_variable* v : groups[i]) {
        inputs.push_back(v->variable);
        names.push_back(v->name);
      }
      const node_id w =
          g.add_node("save_shard", inputs,
                     {{"names", any_tensor::from_vector<std::string>(
                                    loom::shape{static_cast<std::int64_t>(names.size())}, names)},
                      {"shard", static_cast<std::int64_t>(i)},
                      {"num_shards", static_cast<std::int64_t>(groups.size())}},
                     "shard_" + std::to_string(i));
      g.mutable_node(w).colocation_group = g.node(groups[i].front()->variable).colocation();
      shard_writers_.push_back(w);
    }
  }

  // Deletes the shard files of the checkpoint at `path` (whatever their count).
  static void remove_shard_files(const std::string& path) {
    const std::filesystem::path p(path);
    const std::string stem = p.filename().string() + ".data-";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(
             p.has_parent_path() ? p.parent_path() : std::filesystem::path("."), ec))
      if (entry.path().filename().string().rfind(stem, 0) == 0)
        std::filesystem::remove(entry.path(), ec);
  }

  // The state file names `path`; checkpoints past max_to_keep go.
  void record_saved(const std::string& path) {
    const std::string dir = detail::ckpt::parent_dir(path);
    if (last_checkpoints_.empty()) // adopt what an earlier run kept here (TF's recover)
      if (auto st = get_checkpoint_state(dir)) {
        std::error_code ec;
        for (auto& p : st->all_model_checkpoint_paths)
          if (std::filesystem::is_regular_file(p, ec))
            last_checkpoints_.push_back(p);
      }
    auto same = [&](const std::string& p) { return same_file_name(p, path); };
    last_checkpoints_.erase(
        std::remove_if(last_checkpoints_.begin(), last_checkpoints_.end(), same),
        last_checkpoints_.end());
    last_checkpoints_.push_back(path);
    std::vector<std::string> doomed;
    if (max_to_keep_ > 0)
      while (last_checkpoints_.size() > static_cast<std::size_t>(max_to_keep_)) {
        doomed.push_back(last_checkpoints_.front());
        last_checkpoints_.erase(last_checkpoints_.begin());
      }
    write_checkpoint_state(dir,
                           max_to_keep_ > 0 ? last_checkpoints_ : std::vector<std::string>{path});
    for (auto& p : doomed) { // after the state file stops naming them
      ::unlink(p.c_str());
      remove_shard_files(p);
    }
  }

public:
  // Restores every variable from the checkpoint at `path`, after checking the
  // file and that it holds each variable with its dtype and shape, feeding
  // them in groups of at most group_bytes (one run each). A shard of a
  // partitioned variable saved with another count of shards (or saved whole,
  // or restored whole) is put together row by row from the saved shards, each
  // id's row where the lookup now finds it. Extra tensors in the file are
  // ignored.
  void restore(session& s, const std::string& path) {
    check_session(s);
    checkpoint_reader reader(path);
    for (const auto& e : reader.entries())
      if (!e.crc_ok)
        reader.read(e); // throws, naming the tensor
    // Every variable checked before anything is fed.
    std::vector<std::optional<relayout>> plans;
    std::map<std::string, std::size_t> shards_left; // per repartitioned variable
    for (const auto& v : vars_) {
      plans.push_back(plan_relayout(reader, path, v));
      if (plans.back()) {
        ++shards_left[plans.back()->whole];
        continue;
      }
      const checkpoint_entry* e = reader.find(v.name);
      if (!e)
        throw not_found_error("checkpoint " + path + ": no tensor '" + v.name +
                              "' for the variable of that name (the file holds " +
                              std::to_string(reader.entries().size()) + " tensors" +
                              names_sample(reader) + ")");
      if (e->type != v.type)
        throw invalid_argument_error("checkpoint " + path + ": tensor '" + v.name + "' is " +
                                     std::string(to_string(e->type)) + ", the variable is " +
                                     std::string(to_string(v.type)));
      if (!(e->shape == v.shape))
        throw invalid_argument_error("checkpoint " + path + ": tensor '" + v.name + "' has shape " +
                                     e->shape.to_string() + ", the variable has " +
                                     v.shape.to_string());
    }
    std::map<std::string, std::vector<any_tensor>> saved; // the saved shards being relaid out
    std::vector<std::pair<node_id, any_tensor>> feeds;
    std::vector<node_id> targets;
    std::size_t bytes = 0;
    auto flush = [&] {
      if (!feeds.empty())
        s.run_nodes({}, targets, feeds);
      feeds.clear();
      targets.clear();
      bytes = 0;
    };
    for (std::size_t i = 0; i < vars_.size(); ++i) {
      const saved_variable& v = vars_[i];
      if (bytes > 0 && bytes + bytes_of(v) > group_bytes)
        flush();
      if (const auto& plan = plans[i]) {
        feeds.emplace_back(v.value, relaid(reader, *plan, v, saved[plan->whole]));
        if (--shards_left[plan->whole] == 0)
          saved.erase(plan->whole);
      } else {
        feeds.emplace_back(v.value, reader.read(*reader.find(v.name)));
      }
      targets.push_back(v.assign);
      bytes += bytes_of(v);
    }
    flush();
    iterators_.restore(s, [&](const std::string& key) { return reader.read_tensor(key); });
  }

  // Puts the graph's iterators back where the checkpoint at `path` left them, the
  // variables untouched (a chief restarted while the ps tasks kept its variables).
  void restore_iterators(session& s, const std::string& path) {
    check_session(s);
    if (iterators_.empty())
      return;
    checkpoint_reader reader(path);
    iterators_.restore(s, [&](const std::string& key) { return reader.read_tensor(key); });
  }

  const std::vector<saved_variable>& variables() const noexcept { return vars_; }
  // The checkpoints this saver keeps, oldest first (TF's last_checkpoints).
  const std::vector<std::string>& last_checkpoints() const noexcept { return last_checkpoints_; }
  // Takes over checkpoints written earlier, so max_to_keep deletes them in
  // turn (TF's recover_last_checkpoints).
  void recover_last_checkpoints(std::vector<std::string> paths) {
    last_checkpoints_ = std::move(paths);
  }

private:
  // Bytes a fetch or a feed of the variables moves per run, at most (one
  // variable larger than this goes alone): well under a message's limit.
  static constexpr std::size_t group_bytes = std::size_t{256} << 20;

  static std::size_t bytes_of(const saved_variable& v) {
    return static_cast<std::size_t>(std::max<std::int64_t>(v.shape.num_elements(), 1)) *
           std::max<std::size_t>(size_of(v.type), 1);
  }

  // The layout of a shard in this graph. A slot's strategy is its primary's
  // (a lookup may have said it after the slot was made).
  std::optional<detail::partition_layout> layout_in_graph(const node_def& n) const {
    auto layout = detail::layout_of(n);
    if (layout && n.has_attr("_partition_primary"))
      if (const auto primary = graph_.try_find(n.attr<std::string>("_partition_primary")))
        layout->strategy =
            graph_.node(*primary).attr_or<std::string>("_partition_strategy", layout->strategy);
    return layout;
  }

  // The layout of every partitioned variable among vars_, by its name, with
  // the checkpoint keys of its shards in order (a variable some of whose
  // shards this saver does not save gets no record).
  std::map<std::string, detail::partition_layout> partitioned_layouts() const {
    std::map<std::string, detail::partition_layout> out;
    for (const auto& v : vars_) {
      const node_def& n = graph_.node(v.variable);
      const auto layout = layout_in_graph(n);
      if (!layout)
        continue;
      auto [it, fresh] = out.try_emplace(n.attr<std::string>("_partition_of"), *layout);
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

  // How to put a shard together from a checkpoint that laid its variable out
  // otherwise.
  struct relayout {
    std::string whole;                   // the partitioned variable
    detail::partition_layout was, is;    // in the file, in the graph
    std::vector<std::string> saved_keys; // the file's shards, in order
    std::int64_t index = 0;              // this shard's, in the graph
    bool was_div = true, is_div = true;  // how ids spread, on each side
  };

  // nullopt where v is in the file as it is in the graph (or the file lacks
  // it: the caller's not-found error); checks what a relayout needs.
  std::optional<relayout> plan_relayout(const checkpoint_reader& reader, const std::string& path,
                                        const saved_variable& v) const {
    const node_def& node = graph_.node(v.variable);
    const auto now = layout_in_graph(node);
    relayout r;
    r.whole = now ? node.attr<std::string>("_partition_of") : v.name;
    const checkpoint_entry* record = reader.find(detail::partition_layout::key(r.whole));
    if (!now && !record)
      return std::nullopt; // neither side partitioned
    const std::string where = "checkpoint " + path + ", variable '" + r.whole + "'";
    if (record) {
      r.was = detail::partition_layout::parse(reader.read(*record), where);
      r.saved_keys = r.was.shard_keys;
    } else { // saved whole
      const checkpoint_entry* e = reader.find(r.whole);
      if (!e)
        return std::nullopt; // the shards by their own names, or not found
      r.was.full = e->shape;
      r.saved_keys = {r.whole};
    }
    r.is = now ? *now : detail::partition_layout{r.was.strategy, 1, 0, v.shape, {}};
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
          r.was.strategy + "\" strategy, and is now looked up with \"" + r.is.strategy +
          "\" over " + std::to_string(r.is.count) +
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
          detail::shard_rows(static_cast<std::int64_t>(p), r.was.count, r.was.full[0], r.was_div);
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

  // The value of v, each row taken from the saved shard that held its id.
  // `saved` caches the saved shards of v's variable (read on first use).
  any_tensor relaid(const checkpoint_reader& reader, const relayout& r, const saved_variable& v,
                    std::vector<any_tensor>& saved) const {
    if (saved.empty())
      for (const std::string& key : r.saved_keys)
        saved.push_back(reader.read(*reader.find(key)));
    const std::int64_t rows = r.is.full[0];
    const auto width = static_cast<std::size_t>(rows == 0 ? 0 : r.is.full.num_elements() / rows);
    const std::size_t row_bytes = width * size_of(v.type);
    any_tensor out(v.type, v.shape);
    auto* dst = static_cast<std::byte*>(out.raw_data());
    for (std::int64_t row = 0; row < v.shape[0]; ++row) {
      const std::int64_t id = detail::id_at(r.index, row, r.is.count, rows, r.is_div);
      const auto from = detail::route_id(id, r.was.count, rows, r.was_div);
      const auto* src =
          static_cast<const std::byte*>(saved[static_cast<std::size_t>(from.shard)].raw_data());
      std::memcpy(dst + static_cast<std::size_t>(row) * row_bytes,
                  src + static_cast<std::size_t>(from.row) * row_bytes, row_bytes);
    }
    return out;
  }

  void check_session(const session& s) const {
    if (!(s.graph_ref() == graph_))
      throw invalid_argument_error("saver: the session runs another graph than the saver's");
  }

  static bool same_file_name(const std::string& a, const std::string& b) {
    std::error_code ea, eb;
    const auto pa = std::filesystem::absolute(a, ea).lexically_normal();
    const auto pb = std::filesystem::absolute(b, eb).lexically_normal();
    return ea || eb ? a == b : pa == pb;
  }

  static std::string names_sample(const checkpoint_reader& r) {
    std::string out;
    std::size_t shown = 0;
    for (const auto& e : r.entries()) {
      if (shown == 8) {
        out += ", ...";
        break;
      }
      out += (shown++ ? ", '" : ": '") + e.name + "'";
    }
    return out;
  }

  graph graph_;
  int max_to_keep_;
  detail::iterator_checkpoint iterators_;
  std::vector<saved_variable> vars_;
  node_id filename_ = no_node;         // sharded: the path fed to every shard writer
  std::vector<node_id> shard_writers_; // sharded: one save_shard per task
  std::vector<std::string> last_checkpoints_;
};

} // namespace loom
