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
// Two formats (saver_options::format): loom's own (core/checkpoint_format.hpp)
// and, the default, TensorFlow's V2 checkpoint (core/tensor_bundle.hpp: PREFIX.index and
// PREFIX.data-*), which TF's Saver restores. In TF's, a shard of a partitioned
// variable is saved as TF saves one, as its slice of the whole variable under the
// whole's name (TF's save_slice_info: "emb" with parts [0:4], [4:7], [7:10], and
// its slot "emb/Adagrad" likewise), so TF restores it into its own partitioning
// whatever its count. A restore reads either format (TF's where PREFIX.index
// exists) into any partitioning.
//
// Sharded (saver_options::sharded, TF's Saver(sharded=True)): each task
// writes its own variables to its shard file in the same run, in parallel,
// and no saved byte crosses the network; the saver then writes the file that
// names the shards (loom's manifest, TF's index), last, so a checkpoint is whole
// or absent. The tasks and the saver must see one filesystem at the same path
// (TF's assumption too: a shared or network filesystem across hosts).
//
// Beside the variables, what stateful nodes hold outside them (train/state_checkpoint.hpp):
// the position of each iterator of the graph and the admission counts of each hash table
// shard, in either format: save() writes them, restore() puts them back.
//
// The directory's state file: train/checkpoint_state.hpp; every file written
// durably (durable_file.hpp).
#pragma once

#include <loom/core/byte_progress.hpp>
#include <loom/core/checkpoint_format.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_relayout.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/train/disk_tier_checkpoint.hpp>
#include <loom/train/saver_options.hpp>
#include <loom/train/state_checkpoint.hpp>

#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
// The tensor of an incremental checkpoint (train/incremental_saver.hpp) that says
// which link of its chain it is; a saver restores no increment.
inline constexpr const char* increment_sequence_key = "_increment/sequence";
} // namespace detail

class saver {
public:
  // What the saver saves, and the nodes that restore it (train/checkpoint_relayout.hpp).
  using saved_variable = detail::saved_variable;

  explicit saver(graph& g, saver_options o = {});

  // Saves every variable (fetched in one run) to `prefix` or, with a global
  // step, to "prefix-<step>", in the saver's format; updates the directory's
  // state file and deletes the checkpoints beyond max_to_keep. Returns the path
  // written. A save that fails leaves any checkpoint of that name as it was.
  std::string save(session& s, const std::string& prefix,
                   std::optional<std::int64_t> global_step = {});

private:
  // The variables' values in order, fetched in groups of at most group_bytes,
  // each in one run, as value(i) asks for them: a model larger than a message
  // or than this process's memory saves in pieces. (Each group is one snapshot;
  // in async training other workers may update between groups, as between TF's
  // SaveV2 reads.)
  std::function<any_tensor(std::size_t)> fetch_in_groups(session& s) const;

  // The progress of a save or restore of every variable, in the log where it is large.
  detail::byte_progress progress(const char* doing, const char* done,
                                 const std::string& path) const;

  // Appends the disk tiers' tensors to `records`: once the variables are read.
  void take_tiers(session& s, std::vector<std::pair<std::string, any_tensor>>& records) {
    tiers_taken_ = true;
    for (auto& tier : tiers_.save(s))
      records.push_back(std::move(tier));
  }

  void save_one_file(session& s, const std::string& path,
                     std::vector<std::pair<std::string, any_tensor>> records);

  // Every task writes its shard in one run; then the manifest, last.
  void save_sharded(session& s, const std::string& path,
                    std::vector<std::pair<std::string, any_tensor>> records);

  // TF's format: the data files under a temporary prefix (the saver's one, or
  // each task's where sharded, and the saver's records, partitionings and
  // iterator positions, in a file of their own after those), then moved to
  // `path`, then the index, last.
  void save_tensorflow(session& s, const std::string& path,
                       std::vector<std::pair<std::string, any_tensor>> records);

  // One shard writer per task that holds variables: the variables grouped by
  // the device their colocation group asked for (a slot goes with its
  // variable), each group's writer colocated with its first variable.
  void add_shard_writers(graph& g);

  // Deletes the data files of the checkpoint at `path` (whatever their count and
  // format) but those in `keep`.
  static void remove_shard_files(const std::string& path,
                                 const std::vector<std::string>& keep = {});

  // The state file names `path`; checkpoints past max_to_keep go.
  void record_saved(const std::string& path);

public:
  // Restores every variable from the checkpoint at `path`, of either format
  // (TF's where "<path>.index" exists), after checking that it holds each
  // variable with its dtype and shape, feeding them in groups of at most
  // group_bytes (one run each). A shard of a partitioned variable saved with
  // another count of shards (or saved whole, or restored whole) gets its rows
  // from the saved shards, each id's row where the lookup now finds it (TF's
  // format: its slice of the whole, as TF restores it, unless the variable is
  // looked up with the "mod" strategy). Extra tensors in the file are ignored.
  void restore(session& s, const std::string& path) {
    check_session(s);
    if (is_tensorflow(path))
      restore_tensorflow(s, path);
    else
      restore_loom(s, path);
  }

  // Puts the graph's iterators back where the checkpoint at `path` (either
  // format) left them, the variables and admission counts untouched (a chief
  // restarted while the ps tasks kept them).
  void restore_iterators(session& s, const std::string& path);

private:
  // What a checkpoint holds beside the variables, restored after them from `reader` (either
  // format's): the stateful nodes' pieces (those of kind `only`, where given; then nothing
  // else) and the disk tiers.
  template <class Reader>
  void restore_beside_variables(session& s, const Reader& reader,
                                std::optional<detail::state_checkpoint::kind> only = std::nullopt) {
    const auto has = [&](const std::string& key) { return reader.has_tensor(key); };
    const auto read = [&](const std::string& key) { return reader.read_tensor(key); };
    state_.restore(s, has, read, only);
    if (!only)
      tiers_.restore(s, has, read);
  }

  static bool is_tensorflow(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(tensor_bundle::index_path(path), ec);
  }

  // Feeds each variable value(i), in groups of at most group_bytes, one run each.
  void feed_in_groups(session& s, const std::string& path,
                      const std::function<any_tensor(std::size_t)>& value);

  // Every checksum checked before anything is fed.
  void restore_loom(session& s, const std::string& path);

  // TF's format: each variable is its whole tensor, or its slice of it (read
  // from whichever saved parts overlap it); a "mod"-spread shard restored into
  // another count of shards gets each id's row. Every variable is checked
  // before anything is fed; each tensor's checksum as it is read.
  void restore_tensorflow(session& s, const std::string& path);

public:
  const std::vector<saved_variable>& variables() const noexcept { return vars_; }
  // Its save and restore nodes of what the graph's stateful nodes hold outside variables
  // (an incremental_saver saves these pieces too, whole, in each increment).
  const detail::state_checkpoint& state() const noexcept { return state_; }
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

  static std::size_t bytes_of(const saved_variable& v);

  void check_session(const session& s) const {
    if (!(s.graph_ref() == graph_))
      throw invalid_argument_error("saver: the session runs another graph than the saver's");
  }

  static bool same_file_name(const std::string& a, const std::string& b);

  graph graph_;
  int max_to_keep_;
  checkpoint_format format_;
  std::uint64_t progress_every_;
  detail::state_checkpoint state_;     // iterators' positions, admission counts
  detail::disk_tier_checkpoint tiers_; // hash embeddings' disk tiers, taken after vars_
  std::vector<saved_variable> vars_;
  node_id filename_ = no_node;         // sharded: the path fed to every shard writer
  std::vector<node_id> shard_writers_; // sharded: one save_shard per task
  bool has_records_ = false;           // sharded, TF's format: the saver writes a data file too
  bool tiers_taken_ = false;           // in save(): the disk tiers were taken
  std::vector<std::string> last_checkpoints_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE saver::saver(graph& g, saver_options o)
    : graph_(g), max_to_keep_(o.max_to_keep), format_(o.format),
      progress_every_(o.progress_every_bytes) {
  if (!o.var_list.empty() && !o.var_names.empty())
    throw invalid_argument_error("saver: var_list and var_names both given; give one");
  std::vector<std::pair<std::string, node_id>> named = o.var_names;
  if (named.empty())
    for (node_id id : o.var_list.empty() ? g.collection(collection::global_variables) : o.var_list)
      named.emplace_back("", id); // "": by its own name
  if (named.empty())
    throw invalid_argument_error("saver: no variables to save");
  for (const auto& [name, id] : named) // every id checked before the graph changes
    if (g.node(id).op != "variable")
      throw invalid_argument_error("saver: node " + g.node(id).describe() + " is not a variable");
  std::vector<saved_variable> vars;
  for (const auto& entry : named) {
    const std::string& name = entry.first;
    const node_id id = entry.second; // not a structured binding: clang 14 cannot capture one
    if (std::any_of(vars.begin(), vars.end(), [&](auto& v) { return v.variable == id; }))
      continue;
    vars.push_back(detail::saved_variable_of(g.node(id), name));
    // One name per variable; a name TF's format saves a whole variable under
    // takes no other (shards of one variable share theirs).
    const saved_variable& v = vars.back();
    for (std::size_t i = 0; i + 1 < vars.size(); ++i)
      if (vars[i].name == v.name || (vars[i].whole == v.whole && (!vars[i].slice || !v.slice)))
        throw invalid_argument_error("saver: variables '" + g.node(vars[i].variable).name +
                                     "' and '" + g.node(id).name + "' are both saved as '" +
                                     v.whole + "'");
  }
  // The restore nodes take no name scope, device scope or control dependency
  // of wherever the saver is made.
  auto no_names = g.name_scope("");
  auto no_deps = g.control_dependencies(nullptr);
  auto no_device = g.device(nullptr);
  state_ = detail::state_checkpoint(g, vars);
  auto names = g.name_scope("save");
  for (saved_variable& v : vars) {
    const node_id id = v.variable;
    v.value =
        g.add_node("placeholder", {}, {{"dtype", v.type}, {"shape", v.shape}}, v.name + "/value");
    // Fed on the variable's task: the value crosses the network once.
    g.mutable_node(v.value).colocation_group = g.node(id).colocation();
    v.assign = g.add_node("assign", {id, v.value}, {}, v.name + "/assign");
  }
  vars_ = std::move(vars);
  tiers_ = detail::disk_tier_checkpoint(g, vars_);
  if (o.sharded)
    add_shard_writers(g);
}

LOOM_COMPILED_ONCE std::string saver::save(session& s, const std::string& prefix,
                                           std::optional<std::int64_t> global_step) {
  check_session(s);
  if (prefix.empty())
    throw invalid_argument_error("saver::save: empty checkpoint prefix");
  const std::string path = global_step ? prefix + "-" + std::to_string(*global_step) : prefix;
  // The layout of each partitioned variable, once, beside its shards: how
  // its ids spread, so that a restore into another count of shards keeps
  // each id's row (TF's format has no field for it; TF ignores the extra
  // string tensor).
  std::vector<std::pair<std::string, any_tensor>> records;
  for (const auto& [whole, layout] : detail::checkpoint_relayout(graph_).partitioned_layouts(vars_))
    records.emplace_back(detail::partition_layout::key(whole), layout.to_tensor());
  for (auto& piece : state_.save(s))
    records.push_back(std::move(piece));
  // The disk tiers are taken after the variables are read (disk_tier_checkpoint.hpp): each
  // path calls take_tiers(records) then. A save that fails in between still takes them,
  // so that no shard keeps records for a save that will not come.
  tiers_taken_ = false;
  tiers_.begin(s);
  try {
    if (format_ == checkpoint_format::tensorflow)
      save_tensorflow(s, path, std::move(records));
    else if (!shard_writers_.empty())
      save_sharded(s, path, std::move(records));
    else
      save_one_file(s, path, std::move(records));
  } catch (...) {
    if (!tiers_taken_) {
      try {
        tiers_.save(s);
      } catch (...) { // the save's own error is the one to report
      }
    }
    throw;
  }
  record_saved(path);
  return path;
}

LOOM_COMPILED_ONCE auto saver::fetch_in_groups(session& s) const
    -> std::function<any_tensor(std::size_t)> {
  struct state {
    std::vector<any_tensor> group;
    std::size_t begin = 0;
  };
  return [this, &s, st = std::make_shared<state>()](std::size_t i) {
    if (i < st->begin || i >= st->begin + st->group.size()) {
      st->begin = i;
      std::vector<node_id> ids;
      std::size_t bytes = 0;
      for (std::size_t j = i;
           j < vars_.size() && (j == i || bytes + bytes_of(vars_[j]) <= group_bytes); ++j) {
        ids.push_back(vars_[j].variable);
        bytes += bytes_of(vars_[j]);
      }
      st->group = s.run_nodes(ids, {});
      for (std::size_t k = 0; k < st->group.size(); ++k) {
        const saved_variable& v = vars_[st->begin + k];
        if (st->group[k].type() != v.type || !(st->group[k].shape() == v.shape))
          throw internal_error("saver: variable '" + v.name + "' is " + st->group[k].describe() +
                               ", its node says " + std::string(to_string(v.type)) +
                               v.shape.to_string());
      }
    }
    return std::move(st->group[i - st->begin]);
  };
}

LOOM_COMPILED_ONCE auto saver::progress(const char* doing, const char* done,
                                        const std::string& path) const -> detail::byte_progress {
  std::uint64_t total = 0;
  for (const auto& v : vars_)
    total += bytes_of(v);
  return {std::string(doing) + " checkpoint " + path, std::string(done) + " checkpoint " + path,
          total, progress_every_};
}

LOOM_COMPILED_ONCE void
saver::save_one_file(session& s, const std::string& path,
                     std::vector<std::pair<std::string, any_tensor>> records) {
  auto value = fetch_in_groups(s);
  auto said = progress("saving", "saved", path);
  const std::size_t count = vars_.size() + records.size() + tiers_.record_count();
  write_checkpoint_file(path, count, [&](std::size_t i) {
    if (i == vars_.size())
      take_tiers(s, records); // every variable was read by now
    if (i >= vars_.size())
      return std::move(records[i - vars_.size()]);
    said.add(bytes_of(vars_[i]));
    return std::pair<std::string, any_tensor>(vars_[i].name, value(i));
  });
  said.finish();
}

LOOM_COMPILED_ONCE void
saver::save_sharded(session& s, const std::string& path,
                    std::vector<std::pair<std::string, any_tensor>> records) {
  remove_shard_files(path); // what an interrupted save with this name left
  s.run_nodes({}, shard_writers_, {{filename_, any_tensor::scalar<std::string>(path)}});
  take_tiers(s, records);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < shard_writers_.size(); ++i)
    names.push_back(std::filesystem::path(detail::checkpoint_shard_path(
                                              path, static_cast<std::int64_t>(i),
                                              static_cast<std::int64_t>(shard_writers_.size())))
                        .filename()
                        .string());
  records.emplace_back(std::string(detail::checkpoint_shards_key),
                       any_tensor::from_vector<std::string>(
                           loom::shape{static_cast<std::int64_t>(names.size())}, names));
  write_checkpoint_file(path, records.size(), [&](std::size_t i) { return std::move(records[i]); });
}

LOOM_COMPILED_ONCE void
saver::save_tensorflow(session& s, const std::string& path,
                       std::vector<std::pair<std::string, any_tensor>> records) {
  namespace tb = tensor_bundle;
  const std::string staging = path + ".tmp-" + std::to_string(::getpid());
  const int task_files = static_cast<int>(shard_writers_.size());
  const int num_shards = shard_writers_.empty() ? 1 : task_files + (has_records_ ? 1 : 0);
  if (!records.empty() && !shard_writers_.empty() && !has_records_)
    throw internal_error("saver: partitioning records at save that the saver did not expect");
  std::vector<tb::entry> entries;
  try {
    if (shard_writers_.empty()) {
      auto value = fetch_in_groups(s);
      auto said = progress("saving", "saved", path);
      const std::size_t count = vars_.size() + records.size() + tiers_.record_count();
      entries = tb::write_shard(staging, 0, 1, count, [&](std::size_t i) {
        if (i == vars_.size())
          take_tiers(s, records); // every variable was read by now
        if (i >= vars_.size()) {
          auto& [name, tensor] = records[i - vars_.size()];
          return tb::tensor_to_save{name, std::move(tensor), {}, {}};
        }
        said.add(bytes_of(vars_[i]));
        return tb::tensor_to_save{vars_[i].whole, value(i), vars_[i].slice, vars_[i].whole_shape};
      });
      said.finish();
    } else {
      const auto written =
          s.run_nodes(shard_writers_, {}, {{filename_, any_tensor::scalar<std::string>(staging)}});
      take_tiers(s, records);
      for (std::size_t w = 0; w < written.size(); ++w) {
        const std::string* out = written[w].data<std::string>();
        for (std::int64_t k = 0; k + 1 < written[w].num_elements(); k += 2)
          entries.push_back(tb::detail::decode_entry(
              out[k], out[k + 1], "saver: the entry of shard " + std::to_string(w)));
      }
      if (has_records_) {
        auto more =
            tb::write_shard(staging, task_files, num_shards, records.size(), [&](std::size_t i) {
              auto& [name, tensor] = records[i];
              return tb::tensor_to_save{name, std::move(tensor), {}, {}};
            });
        entries.insert(entries.end(), more.begin(), more.end());
      }
    }
  } catch (...) {
    remove_shard_files(staging);
    throw;
  }
  // The previous checkpoint of this name, if any, loses its index before its
  // data files are replaced: it is absent, never an index naming other data.
  std::error_code ec;
  std::filesystem::remove(tb::index_path(path), ec);
  std::vector<std::string> keep;
  for (int i = 0; i < num_shards; ++i) {
    keep.push_back(tb::data_path(path, i, num_shards));
    if (::rename(tb::data_path(staging, i, num_shards).c_str(), keep.back().c_str()) != 0)
      detail::ckpt::throw_io(
          "checkpoint " + path + ": cannot move its data file into place " + keep.back(), errno);
  }
  tb::write_index(path, num_shards, std::move(entries));
  remove_shard_files(path, keep); // an earlier checkpoint's of this name, of another count
}

LOOM_COMPILED_ONCE void saver::add_shard_writers(graph& g) {
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
  // TF's format: the saver writes the partitioning records and the iterators'
  // positions to a data file of its own, after the tasks' files.
  has_records_ = format_ == checkpoint_format::tensorflow &&
                 (!detail::checkpoint_relayout(g).partitioned_layouts(vars_).empty() ||
                  !state_.empty() || !tiers_.empty());
  const auto num_shards = static_cast<std::int64_t>(groups.size() + (has_records_ ? 1 : 0));
  filename_ = g.add_node("placeholder", {}, {{"dtype", dtype::string}, {"shape", loom::shape{}}},
                         "filename");
  auto strings = [](const std::vector<std::string>& v) {
    return any_tensor::from_vector<std::string>(loom::shape{static_cast<std::int64_t>(v.size())},
                                                v);
  };
  for (std::size_t i = 0; i < groups.size(); ++i) {
    std::vector<node_id> inputs{filename_};
    std::vector<std::string> names, specs;
    for (const saved_variable* v : groups[i]) {
      inputs.push_back(v->variable);
      names.push_back(format_ == checkpoint_format::tensorflow ? v->whole : v->name);
      specs.push_back(v->spec());
    }
    attr_map attrs{{"names", strings(names)},
                   {"shard", static_cast<std::int64_t>(i)},
                   {"num_shards", num_shards},
                   {"progress_every_bytes", static_cast<std::int64_t>(progress_every_)}};
    if (format_ == checkpoint_format::tensorflow) {
      attrs.emplace("format", std::string("tensorflow"));
      attrs.emplace("shape_and_slices", strings(specs));
    }
    const node_id w =
        g.add_node("save_shard", inputs, std::move(attrs), "shard_" + std::to_string(i));
    g.mutable_node(w).colocation_group = g.node(groups[i].front()->variable).colocation();
    shard_writers_.push_back(w);
  }
}

LOOM_COMPILED_ONCE void saver::remove_shard_files(const std::string& path,
                                                  const std::vector<std::string>& keep) {
  const std::filesystem::path p(path);
  const std::string stem = p.filename().string() + ".data-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(
           p.has_parent_path() ? p.parent_path() : std::filesystem::path("."), ec))
    if (entry.path().filename().string().rfind(stem, 0) == 0 &&
        std::none_of(keep.begin(), keep.end(), [&](const std::string& k) {
          return std::filesystem::path(k).filename() == entry.path().filename();
        }))
      std::filesystem::remove(entry.path(), ec);
}

LOOM_COMPILED_ONCE void saver::record_saved(const std::string& path) {
  const std::string dir = detail::ckpt::parent_dir(path);
  if (last_checkpoints_.empty()) // adopt what an earlier run kept here (TF's recover)
    if (auto st = get_checkpoint_state(dir)) {
      for (auto& p : st->all_model_checkpoint_paths)
        if (checkpoint_exists(p))
          last_checkpoints_.push_back(p);
    }
  auto same = [&](const std::string& p) { return same_file_name(p, path); };
  last_checkpoints_.erase(std::remove_if(last_checkpoints_.begin(), last_checkpoints_.end(), same),
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
    ::unlink(tensor_bundle::index_path(p).c_str());
    remove_shard_files(p);
  }
}

LOOM_COMPILED_ONCE void saver::restore_iterators(session& s, const std::string& path) {
  check_session(s);
  if (!state_.holds(detail::state_checkpoint::kind::iterator))
    return;
  if (is_tensorflow(path))
    restore_beside_variables(s, tensor_bundle::reader(path),
                             detail::state_checkpoint::kind::iterator);
  else
    restore_beside_variables(s, checkpoint_reader(path), detail::state_checkpoint::kind::iterator);
}

LOOM_COMPILED_ONCE void saver::feed_in_groups(session& s, const std::string& path,
                                              const std::function<any_tensor(std::size_t)>& value) {
  auto said = progress("restoring", "restored", path);
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
    feeds.emplace_back(v.value, value(i));
    targets.push_back(v.assign);
    bytes += bytes_of(v);
    said.add(bytes_of(v));
  }
  flush();
  said.finish();
}

LOOM_COMPILED_ONCE void saver::restore_loom(session& s, const std::string& path) {
  checkpoint_reader reader(path);
  if (reader.has_tensor(detail::increment_sequence_key))
    throw invalid_argument_error("checkpoint " + path +
                                 " is an increment of a chain: restore it with "
                                 "loom::incremental_saver, which restores its base first");
  for (const auto& e : reader.entries())
    if (!e.crc_ok)
      reader.read(e); // throws, naming the tensor
  // Every variable checked before anything is fed.
  const detail::checkpoint_relayout relayouts(graph_);
  std::vector<std::optional<detail::checkpoint_relayout::relayout>> plans;
  std::map<std::string, std::size_t> shards_left; // per repartitioned variable
  for (const auto& v : vars_) {
    plans.push_back(relayouts.plan_relayout(reader, path, v));
    if (plans.back()) {
      ++shards_left[plans.back()->whole];
      continue;
    }
    const checkpoint_entry* e = reader.find(v.name);
    if (!e) {
      std::vector<std::string> names;
      for (const auto& entry : reader.entries())
        names.push_back(entry.name);
      if (auto other = detail::other_shard_count(path, v.name, names); !other.empty())
        throw invalid_argument_error(std::move(other));
      throw not_found_error("checkpoint " + path + ": no tensor '" + v.name +
                            "' for the variable of that name" +
                            detail::nearest_of(v.name, std::move(names)));
    }
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
  feed_in_groups(s, path, [&](std::size_t i) {
    const saved_variable& v = vars_[i];
    const auto& plan = plans[i];
    if (!plan)
      return reader.read(*reader.find(v.name));
    any_tensor value = relayouts.relaid(reader, *plan, v, saved[plan->whole]);
    if (--shards_left[plan->whole] == 0)
      saved.erase(plan->whole);
    return value;
  });
  restore_beside_variables(s, reader);
}

LOOM_COMPILED_ONCE void saver::restore_tensorflow(session& s, const std::string& path) {
  const tensor_bundle::reader reader(path);
  const detail::checkpoint_relayout relayouts(graph_);
  std::vector<std::optional<detail::checkpoint_relayout::mod_relayout>> plans;
  for (const auto& v : vars_) {
    const tensor_bundle::entry* e = reader.find(v.whole);
    const std::string what = "checkpoint " + path + ": tensor '" + v.whole + "'";
    const std::string variable =
        v.slice ? "the partitioned variable '" +
                      graph_.node(v.variable).attr<std::string>("_partition_of") + "'"
                : "the variable '" + graph_.node(v.variable).name + "'";
    if (!e) {
      std::vector<std::string> names;
      for (const tensor_bundle::entry* entry : reader.entries())
        names.push_back(entry->key);
      if (auto other = detail::other_shard_count(path, v.whole, names); !other.empty())
        throw invalid_argument_error(std::move(other));
      throw not_found_error("checkpoint " + path + ": no tensor '" + v.whole + "' for " + variable +
                            detail::nearest_of(v.whole, reader.nearest_names(v.whole)));
    }
    if (e->tf_dtype != tensor_bundle::tf_dtype_of(v.type))
      throw invalid_argument_error(what + " is " + e->dtype_name() + ", " + variable + " is " +
                                   std::string(to_string(v.type)));
    if (e->shape != v.whole_shape)
      throw invalid_argument_error(what + " has shape " + e->shape.to_string() + ", " + variable +
                                   " has " + v.whole_shape.to_string());
    plans.push_back(relayouts.plan_mod_relayout(reader, *e, v));
  }
  std::map<std::string, any_tensor> wholes; // read once per "mod" variable relaid out
  feed_in_groups(s, path, [&](std::size_t i) {
    const saved_variable& v = vars_[i];
    if (const auto& plan = plans[i]) {
      auto [it, fresh] = wholes.try_emplace(v.whole);
      if (fresh)
        it->second = reader.read_tensor(v.whole);
      return relayouts.mod_relaid(it->second, *plan, v);
    }
    return v.slice ? reader.read_slice(v.whole, *v.slice) : reader.read_tensor(v.whole);
  });
  restore_beside_variables(s, reader);
}

LOOM_COMPILED_ONCE std::size_t saver::bytes_of(const saved_variable& v) {
  return static_cast<std::size_t>(std::max<std::int64_t>(v.shape.num_elements(), 1)) *
         std::max<std::size_t>(size_of(v.type), 1);
}

LOOM_COMPILED_ONCE bool saver::same_file_name(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const auto pa = std::filesystem::absolute(a, ea).lexically_normal();
  const auto pb = std::filesystem::absolute(b, eb).lexically_normal();
  return ea || eb ? a == b : pa == pb;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
