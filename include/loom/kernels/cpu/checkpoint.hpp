// CPU kernels of the checkpoint ops (graph/ops/checkpoint.hpp). save_shard: the task
// writes the values of its own variables to its data file of a sharded checkpoint,
// durably (core/durable_file.hpp), so that no saved byte crosses the network; the
// file that makes the checkpoint whole (loom's manifest, TF's index) is the saver's,
// written after every data file (train/saver.hpp). restore_slice: the task reads a
// tensor, or a slice of it, from a TensorFlow checkpoint (core/tensor_bundle.hpp).
#pragma once

#include <loom/core/byte_progress.hpp>
#include <loom/core/checkpoint_format.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/graph/ops/checkpoint.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::kernels {

template <class T> struct save_shard_cpu {
  static void run(kernel_context& c) {
    const std::string& path = c.input(0).template data<std::string>()[0];
    const std::string* name = c.node.attr<any_tensor>("names").data<std::string>();
    const auto shard = c.node.attr<std::int64_t>("shard");
    const auto num_shards = c.node.attr<std::int64_t>("num_shards");
    const std::size_t count = c.inputs.size() - 1;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < count; ++i)
      total += c.input(i + 1).byte_size();
    const std::string what = " shard " + std::to_string(shard) + " of checkpoint " + path;
    detail::byte_progress said(
        "saving" + what, "saved" + what, total,
        static_cast<std::uint64_t>(c.node.attr_or<std::int64_t>(
            "progress_every_bytes",
            static_cast<std::int64_t>(detail::byte_progress::default_every))));
    auto input = [&](std::size_t i) -> const any_tensor& {
      said.add(c.input(i + 1).byte_size());
      return c.input(i + 1);
    };
    if (c.node.attr_or<std::string>("format", "loom") == "loom") {
      write_checkpoint_file(
          detail::checkpoint_shard_path(path, shard, num_shards), count,
          [&](std::size_t i) { return std::pair<std::string, any_tensor>(name[i], input(i)); });
      said.finish();
      c.output = any_tensor::from_vector<std::string>(loom::shape{0}, {});
      return;
    }
    const std::string* spec = c.node.attr<any_tensor>("shape_and_slices").data<std::string>();
    const std::vector<tensor_bundle::entry> entries = tensor_bundle::write_shard(
        path, static_cast<int>(shard), static_cast<int>(num_shards), count, [&](std::size_t i) {
          tensor_bundle::tensor_to_save t{name[i], input(i), {}, {}};
          if (!spec[i].empty())
            std::tie(t.full_shape, t.slice) = tensor_slice::parse_spec(spec[i]);
          return t;
        });
    said.finish();
    std::vector<std::string> out;
    for (const tensor_bundle::entry& e : entries) {
      out.push_back(e.key);
      out.push_back(tensor_bundle::detail::encode_entry(e));
    }
    c.output = any_tensor::from_vector<std::string>(
        loom::shape{static_cast<std::int64_t>(out.size())}, std::move(out));
  }
};

template <class T> struct restore_slice_cpu {
  static void run(kernel_context& c) {
    const tensor_bundle::reader reader(c.node.attr<std::string>("prefix"));
    const auto& name = c.node.attr<std::string>("tensor_name");
    const auto& spec = c.node.attr<std::string>("shape_and_slice");
    if (spec.empty()) {
      c.output = reader.read_tensor(name, c.node.type, c.node.shape);
      return;
    }
    auto [full, slice] = tensor_slice::parse_spec(spec);
    const tensor_bundle::entry* e = reader.find(name);
    if (e && (e->tf_dtype != tensor_bundle::tf_dtype_of(c.node.type) || e->shape != full))
      throw invalid_argument_error("checkpoint " + reader.prefix() + ": tensor '" + name + "' is " +
                                   e->dtype_name() + e->shape.to_string() + ", restored into " +
                                   std::string(to_string(c.node.type)) + full.to_string());
    c.output = reader.read_slice(name, slice);
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_checkpoint_kernels() {
  register_kernels<save_shard_cpu>("save_shard", type_list<std::string>{});
  register_kernels<restore_slice_cpu>("restore_slice", all_types{});
  return true;
}

inline const bool checkpoint_kernels_registered = register_checkpoint_kernels();
#endif

} // namespace loom::kernels
