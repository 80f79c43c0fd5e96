// CPU kernels of sources, state and plumbing.
#pragma once

#include <loom/kernels/checks/state.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/metadata.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

namespace loom::kernels {

template <class T> struct constant_cpu {
  static void run(kernel_context& c) { c.output = c.node.attr<any_tensor>("value"); }
};

// Reading a variable shares its buffer; the executor clones a fetched
// variable so that later updates never change a value already returned. The
// executor hands the node's own variable as its one ref (looked up once per
// plan, not by name every step); a caller without it, the lookup by name.
template <class T> struct variable_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = c.refs.empty() ? c.resources.variable(c.node) : *c.refs[0];
    std::lock_guard lock(v.mu);
    check_variable_initialized(c.node, v);
    c.output = v.value;
  }
};

template <class T> struct assign_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    const any_tensor& value = c.input(1);
    const node_def& n = c.node;
    std::lock_guard lock(v.mu);
    if (n.op == "assign") {
      // A value nothing else holds (a tensor received for this step) becomes
      // the variable's buffer as it is: a 64 MB assign from the network is
      // then never copied. Otherwise a copy, so the variable owns its state.
      v.value = c.may_forward(1) ? value : value.clone();
      v.initialized = true;
      v.changes.reset(); // every row changed: the next incremental save takes them all
    } else {
      check_assign_update(n, v, value);
      if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, bool>) {
        throw_no_arithmetic(n, dtype_of<T>);
      } else {
        // In place when nothing else holds the value (TF's AssignAdd updates in
        // place too); otherwise into another buffer, so values read earlier in
        // this step stay as they were.
        any_tensor next =
            v.value.sole_owner() ? v.value : any_tensor(v.value.type(), v.value.shape());
        const auto count = static_cast<Eigen::DenseIndex>(next.num_elements());
        const bool add = n.op == "assign_add";
        parallel_chunks(c.device, count, Eigen::TensorOpCost(2.0 * sizeof(T), sizeof(T), 1.0),
                        [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
                          auto out = chunk_map<T>(next.data<T>() + f, len);
                          const auto old = chunk_map<const T>(v.value.data<T>() + f, len);
                          const auto d = chunk_map<const T>(value.data<T>() + f, len);
                          if (add)
                            out = old + d;
                          else
                            out = old - d;
                        });
        v.value = std::move(next);
        v.changes.reset();
      }
    }
    c.output = v.value;
  }
};

template <class T> struct fill_cpu {
  static void run(kernel_context& c) {
    c.output = any_tensor(dtype_of<T>, c.node.attr<loom::shape>("shape"));
    const T value = static_cast<T>(c.node.attr<double>("value"));
    const auto n = static_cast<Eigen::DenseIndex>(c.output.num_elements());
    parallel_chunks(c.device, n, Eigen::TensorOpCost(0, sizeof(T), 1.0),
                    [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
                      std::fill_n(c.output.data<T>() + f, len, value);
                    });
  }
};

template <class T> struct fill_like_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    c.output = any_tensor(x.type(), x.shape());
    const T value = c.node.op == "ones_like" ? T(1) : T(0);
    std::fill_n(c.output.data<T>(), c.output.num_elements(), value);
  }
};

// Sums dy over the dimensions that broadcasting expanded to reach x's shape.
template <class T> struct sum_to_shape_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const loom::shape& to = c.input(1).shape();
    if (dy.shape() == to) {
      c.output = dy;
      return;
    }
    const loom::shape& from = dy.shape();
    const std::vector<char> summed = summed_axes(c.node, from, to);
    const int r = from.rank();
    // Row-major strides of the target over dy's axes, 0 along the summed ones.
    std::vector<std::int64_t> to_stride(static_cast<std::size_t>(r), 0);
    std::int64_t s = 1;
    for (int i = r - 1; i >= 0; --i) {
      const auto ui = static_cast<std::size_t>(i);
      to_stride[ui] = summed[ui] ? 0 : s;
      s *= summed[ui] ? 1 : from[i];
    }
    c.output = any_tensor(dy.type(), to);
    T* out = c.output.data<T>();
    std::fill_n(out, c.output.num_elements(), T(0));
    const T* in = dy.data<T>();
    const std::int64_t n = dy.num_elements();
    if (n == 0)
      return;
    // dy's axes as runs of summed and of kept ones (axes of extent 1 left out): a bias's
    // gradient is [summed rows, kept columns], a broadcast column's [kept, summed]. Those
    // loop in dy's order, adding in the order the general walk below does (the same sums
    // to the bit), without its index arithmetic per element.
    std::vector<std::pair<std::int64_t, bool>> runs; // (elements, summed)
    for (int i = 0; i < r; ++i) {
      const bool sum = summed[static_cast<std::size_t>(i)] != 0;
      if (from[i] == 1)
        continue;
      if (!runs.empty() && runs.back().second == sum)
        runs.back().first *= from[i];
      else
        runs.emplace_back(from[i], sum);
    }
    if (runs.size() == 1 && runs[0].second) { // everything into one
      T total = T(0);
      for (std::int64_t k = 0; k < n; ++k)
        total += in[k];
      out[0] = total;
      return;
    }
    if (runs.size() == 2 && runs[0].second) { // columns: out[j] = sum over rows
      const std::int64_t rows = runs[0].first, cols = runs[1].first;
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          out[j] += in[i * cols + j];
      return;
    }
    if (runs.size() == 2 && runs[1].second) { // rows: out[i] = sum over the row
      const std::int64_t rows = runs[0].first, cols = runs[1].first;
      for (std::int64_t i = 0; i < rows; ++i) {
        T total = T(0);
        for (std::int64_t j = 0; j < cols; ++j)
          total += in[i * cols + j];
        out[i] = total;
      }
      return;
    }
    std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
    std::int64_t o = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      out[o] += in[k];
      for (int i = r - 1; i >= 0; --i) { // odometer increment of the index
        auto ui = static_cast<std::size_t>(i);
        ++idx[ui];
        o += to_stride[ui];
        if (idx[ui] < from[i])
          break;
        o -= to_stride[ui] * idx[ui];
        idx[ui] = 0;
      }
    }
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_state_kernels() {
  register_kernels<constant_cpu>("constant", all_types{});
  register_kernels<variable_cpu>("variable", all_types{});
  for (const char* op : {"assign", "assign_add", "assign_sub"})
    register_kernels<assign_cpu>(op, all_types{});
  register_metadata_kernels<all_types>(device_cpu);
  register_kernels<fill_cpu>("fill", all_types_but_string{});
  register_kernels<fill_like_cpu>("zeros_like", numeric_types{});
  register_kernels<fill_like_cpu>("ones_like", numeric_types{});
  register_kernels<sum_to_shape_cpu>("sum_to_shape", numeric_types{});
  return true;
}

inline const bool state_kernels_registered = register_state_kernels();
#endif

} // namespace loom::kernels
