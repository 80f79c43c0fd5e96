// Partitioned variables (TF's get_variable(..., partitioner=...)): one large
// variable stored as shards "name/part_0", "name/part_1", ... along one axis,
// each an ordinary variable, so the device scope places each on its own
// (replica_device_setter deals them round-robin over the ps tasks), the
// saver saves each, and embedding_lookup reads each where it lives.
//
// A partitioner says how many shards, along which axis; the shards split the
// axis as TF does: shard i has size / n rows, plus one for the first size % n.
// TF's three partitioners are here with TF's arithmetic.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/variables.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct partitioning {
  int axis = 0;
  std::int64_t shards = 1;
};

template <class P>
concept partitioner = requires(const P& p, const loom::shape& s, dtype t) {
  { p(s, t) } -> std::convertible_to<partitioning>;
};

namespace detail {

inline std::int64_t element_bytes(dtype t, std::int64_t bytes_per_string_element) {
  return t == dtype::string ? bytes_per_string_element : static_cast<std::int64_t>(size_of(t));
}

// Bytes of one slice of `s` along `axis` (everything but that axis).
LOOM_COMPILED_ONCE std::int64_t slice_bytes(const loom::shape& s, int axis, dtype t,
                                            std::int64_t bytes_per_string_element);

} // namespace detail

// Exactly num_shards shards along axis (tf.fixed_size_partitioner).
struct fixed_size_partitioner {
  std::int64_t num_shards;
  int axis = 0;
  partitioning operator()(const loom::shape&, dtype) const { return {axis, num_shards}; }
};

// As many shards as keep each at least min_slice_size bytes, at most
// max_partitions (tf.min_max_variable_partitioner).
struct min_max_variable_partitioner {
  std::int64_t max_partitions = 1;
  int axis = 0;
  std::int64_t min_slice_size = 256 << 10;
  std::int64_t bytes_per_string_element = 16;
  partitioning operator()(const loom::shape& s, dtype t) const {
    const std::int64_t per_slice =
        std::max<std::int64_t>(1, detail::slice_bytes(s, axis, t, bytes_per_string_element));
    const std::int64_t slices_per_shard =
        std::max<std::int64_t>(1, (min_slice_size + per_slice - 1) / per_slice);
    const std::int64_t shards = (s[axis] + slices_per_shard - 1) / slices_per_shard;
    return {axis, std::max<std::int64_t>(1, std::min(max_partitions, shards))};
  }
};

// Shards of at most max_shard_bytes each, at most max_shards of them
// (tf.variable_axis_size_partitioner).
struct variable_axis_size_partitioner {
  std::int64_t max_shard_bytes;
  int axis = 0;
  std::int64_t bytes_per_string_element = 16;
  std::optional<std::int64_t> max_shards{};
  partitioning operator()(const loom::shape& s, dtype t) const {
    if (max_shard_bytes < 1)
      throw invalid_argument_error("variable_axis_size_partitioner: max_shard_bytes is " +
                                   std::to_string(max_shard_bytes) + "; it must be 1 or more");
    const std::int64_t per_slice = detail::slice_bytes(s, axis, t, bytes_per_string_element);
    const std::int64_t slices_per_shard = std::max<std::int64_t>(1, max_shard_bytes / per_slice);
    std::int64_t shards = (s[axis] + slices_per_shard - 1) / slices_per_shard;
    if (max_shards)
      shards = std::min(shards, *max_shards);
    return {axis, shards};
  }
};

template <element_type T, int R> class partitioned_variable {
public:
  partitioned_variable(std::string name, loom::shape full, int axis,
                       std::vector<variable<T, R>> shards)
      : name_(std::move(name)), shape_(std::move(full)), axis_(axis), shards_(std::move(shards)) {}

  const std::string& name() const noexcept { return name_; }
  // The whole variable's shape, and the axis it is split along.
  const loom::shape& shape() const noexcept { return shape_; }
  int axis() const noexcept { return axis_; }
  const std::vector<variable<T, R>>& shards() const noexcept { return shards_; }
  // The shards as tensors, for embedding_lookup and concat.
  std::vector<output<T, R>> parts() const { return {shards_.begin(), shards_.end()}; }
  // The whole value, joined (TF's conversion of a PartitionedVariable to a tensor).
  output<T, R> value() const { return concat(parts(), axis_); }
  // Every shard's initializer.
  operation initializer() const {
    graph g = shards_.front().graph();
    std::vector<node_id> inits;
    for (const auto& s : shards_)
      inits.push_back(s.initializer().id());
    return group(g, inits, name_ + "/initializer");
  }

private:
  std::string name_;
  loom::shape shape_;
  int axis_;
  std::vector<variable<T, R>> shards_;
};

// get_variable with a partitioner: the shards "<name>/part_<i>" of a variable
// of shape `s`, each initialized by `init` for its own slice (a seeded random
// initializer gets seed + i, so that no two shards are equal; glorot's fans
// are the whole variable's). A partitioner that yields no shard, or more
// shards than the axis has rows, is an error naming the variable.
template <element_type T, int R, initializer I, partitioner P>
partitioned_variable<T, R> get_variable(graph& g, const std::string& name, loom::shape s,
                                        const I& init, const P& partition,
                                        variable_options o = {}) {
  static_assert(R >= 1, "loom::get_variable: a scalar cannot be partitioned");
  if (!s.fully_defined() || s.rank() != R)
    throw invalid_argument_error("get_variable: partitioned variable '" + name +
                                 "' needs a fully defined shape of rank " + std::to_string(R) +
                                 ", got " + s.to_string());
  const partitioning p = partition(s, dtype_of<T>);
  const int axis = p.axis < 0 ? p.axis + R : p.axis;
  if (axis < 0 || axis >= R)
    throw invalid_argument_error("get_variable: the partitioner of '" + name + "' names axis " +
                                 std::to_string(p.axis) + " of a variable of rank " +
                                 std::to_string(R));
  if (p.shards < 1 || p.shards > s[axis])
    throw invalid_argument_error("get_variable: the partitioner of '" + name + "' yields " +
                                 std::to_string(p.shards) + " shard(s) along axis " +
                                 std::to_string(axis) + " of size " + std::to_string(s[axis]) +
                                 "; it must yield between 1 and " + std::to_string(s[axis]));
  std::vector<variable<T, R>> shards;
  for (std::int64_t i = 0; i < p.shards; ++i) {
    std::vector<std::int64_t> d = s.dims();
    d[static_cast<std::size_t>(axis)] = s[axis] / p.shards + (i < s[axis] % p.shards ? 1 : 0);
    const loom::shape part(std::move(d));
    I shard_init = init;
    if constexpr (requires { shard_init.seed; })
      if (shard_init.seed)
        *shard_init.seed += i;
    struct part_initializer {
      const I& init;
      const loom::shape& whole;
      node_id make(graph& gg, dtype t, const loom::shape& ps) const {
        if constexpr (requires { init.make_part(gg, t, ps, whole); })
          return init.make_part(gg, t, ps, whole);
        else
          return init.make(gg, t, ps);
      }
    };
    shards.push_back(get_variable<T, R>(g, name + "/part_" + std::to_string(i), part,
                                        part_initializer{shard_init, s}, o));
  }
  const std::string full = detail::scoped_variable_name(g, name);
  // What a saver needs to restore the shards into another partitioning (TF's
  // save_slice_info): the whole variable's name and shape, and where each
  // shard sits. embedding_lookup adds how ids are spread ("mod" or "div").
  for (std::int64_t i = 0; i < p.shards; ++i) {
    node_def& n = g.mutable_node(shards[static_cast<std::size_t>(i)].id());
    n.attrs["_partition_of"] = full;
    n.attrs["_partition_index"] = i;
    n.attrs["_partition_count"] = p.shards;
    n.attrs["_partition_axis"] = static_cast<std::int64_t>(axis);
    n.attrs["_partition_full_shape"] = s.dims();
  }
  return partitioned_variable<T, R>(full, std::move(s), axis, std::move(shards));
}

// embedding_lookup over a partitioned variable's shards (split along axis 0).
template <class T, expression I>
output<T, rank_of<I> + 1> embedding_lookup(const partitioned_variable<T, 2>& params, const I& ids,
                                           partition_strategy strategy = partition_strategy::mod,
                                           std::optional<double> max_norm = std::nullopt) {
  if (params.axis() != 0)
    throw invalid_argument_error("loom::embedding_lookup: '" + params.name() +
                                 "' is partitioned along axis " + std::to_string(params.axis()) +
                                 "; a lookup needs its rows split (axis 0)");
  return embedding_lookup(params.parts(), ids, strategy, max_norm);
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::int64_t slice_bytes(const loom::shape& s, int axis, dtype t,
                                            std::int64_t bytes_per_string_element) {
  std::int64_t n = 1;
  for (int a = 0; a < s.rank(); ++a)
    if (a != axis)
      n *= s[a];
  return n * element_bytes(t, bytes_per_string_element);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
