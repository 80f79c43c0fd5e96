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
// The file's format: train/checkpoint_format.hpp; the directory's state
// file: train/checkpoint_state.hpp; both written durably (durable_file.hpp).
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_format.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/train/durable_file.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct saver_options {
  // Checkpoints kept on disk; older ones are deleted. 0 or less keeps every
  // file and lists only the newest in the state file (TF's max_to_keep=None).
  int max_to_keep = 5;
  // Variable nodes to save; empty: the global_variables collection.
  std::vector<node_id> var_list{};
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
    std::vector<node_id> ids;
    ids.reserve(vars_.size());
    for (auto& v : vars_)
      ids.push_back(v.variable);
    std::vector<any_tensor> values = s.run_nodes(ids, {});
    for (std::size_t i = 0; i < vars_.size(); ++i)
      if (values[i].type() != vars_[i].type || !(values[i].shape() == vars_[i].shape))
        throw internal_error("saver: variable '" + vars_[i].name + "' is " + values[i].describe() +
                             ", its node says " + std::string(to_string(vars_[i].type)) +
                             vars_[i].shape.to_string());
    std::vector<std::string> names;
    names.reserve(vars_.size());
    for (auto& v : vars_)
      names.push_back(v.name);
    write_checkpoint_file(path, names, values);

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
    for (auto& p : doomed) // after the state file stops naming them
      ::unlink(p.c_str());
    return path;
  }

  // Restores every variable from the checkpoint at `path` in one run, after
  // checking the file and that it holds each variable with its dtype and shape.
  // Extra tensors in the file are ignored.
  void restore(session& s, const std::string& path) {
    check_session(s);
    checkpoint_reader reader(path);
    for (const auto& e : reader.entries())
      if (!e.crc_ok)
        reader.read(e); // throws, naming the tensor
    for (const auto& v : vars_) {
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
    std::vector<std::pair<node_id, any_tensor>> feeds;
    std::vector<node_id> targets;
    feeds.reserve(vars_.size());
    for (const auto& v : vars_) {
      feeds.emplace_back(v.value, reader.read(*reader.find(v.name)));
      targets.push_back(v.assign);
    }
    s.run_nodes({}, targets, feeds);
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
  std::vector<saved_variable> vars_;
  std::vector<std::string> last_checkpoints_;
};

} // namespace loom
