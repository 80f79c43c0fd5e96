// The elements a parsed tf.Example gives: a runtime-typed named structure,
// each feature a dense tensor or a sparse one (TF's dict of Tensor and
// SparseTensor that tf.io.parse_example returns). Its types are known only once
// the spec is, at run time, so each read states the type it expects and a
// wrong guess is one error naming the feature and both types.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>

namespace loom::data {

// A sparse value as three tensors (TF's SparseTensor): value k sits at row k of
// `indices` ([N, rank]) in a tensor of shape `dense_shape` ([rank]).
struct any_sparse {
  tensor<std::int64_t, 2> indices;
  any_tensor values;
  tensor<std::int64_t, 1> dense_shape;
};

// The same with its element type checked: what features::sparse<T> returns,
// ready to feed a loom::sparse_placeholder<T>.
template <element_type T> struct sparse_value {
  tensor<std::int64_t, 2> indices;
  tensor<T, 1> values;
  tensor<std::int64_t, 1> dense_shape;
};

class features {
public:
  using value = std::variant<any_tensor, any_sparse>;

  void set(const std::string& name, any_tensor dense) { values_[name] = std::move(dense); }
  void set(const std::string& name, any_sparse sparse) { values_[name] = std::move(sparse); }

  bool contains(const std::string& name) const { return values_.count(name) != 0; }
  std::size_t size() const noexcept { return values_.size(); }
  const std::map<std::string, value>& all() const noexcept { return values_; }

  // A dense feature as tensor<T, R>.
  template <element_type T, int R> tensor<T, R> dense(const std::string& name) const {
    const any_tensor& v = dense_value(name);
    if (v.type() != dtype_of<T> || v.rank() != R)
      throw invalid_argument_error("feature \"" + name + "\" is " + v.describe() + ", read as " +
                                   std::string(to_string(dtype_of<T>)) + " of rank " +
                                   std::to_string(R));
    return tensor<T, R>::from(v);
  }
  const any_tensor& dense_value(const std::string& name) const;

  // A sparse feature with values of type T.
  template <element_type T> sparse_value<T> sparse(const std::string& name) const {
    const any_sparse& s = sparse_any(name);
    if (s.values.type() != dtype_of<T>)
      throw invalid_argument_error("sparse feature \"" + name + "\" holds " +
                                   std::string(to_string(s.values.type())) + " values, read as " +
                                   std::string(to_string(dtype_of<T>)));
    return {s.indices, tensor<T, 1>::from(s.values, "sparse feature \"" + name + "\""),
            s.dense_shape};
  }
  const any_sparse& sparse_any(const std::string& name) const;

private:
  const value& find(const std::string& name) const;
  std::map<std::string, value> values_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto features::dense_value(const std::string& name) const -> const any_tensor& {
  const value& v = find(name);
  if (const auto* d = std::get_if<any_tensor>(&v))
    return *d;
  throw invalid_argument_error("feature \"" + name +
                               "\" is sparse (a VarLenFeature), read as dense");
}

LOOM_COMPILED_ONCE auto features::sparse_any(const std::string& name) const -> const any_sparse& {
  const value& v = find(name);
  if (const auto* s = std::get_if<any_sparse>(&v))
    return *s;
  throw invalid_argument_error("feature \"" + name +
                               "\" is dense (a FixedLenFeature), read as sparse");
}

LOOM_COMPILED_ONCE auto features::find(const std::string& name) const -> const value& {
  const auto it = values_.find(name);
  if (it == values_.end()) {
    std::string names;
    for (const auto& [n, v] : values_)
      names += (names.empty() ? "" : ", ") + n;
    throw invalid_argument_error("no feature \"" + name + "\" (the features are: " + names + ")");
  }
  return it->second;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
