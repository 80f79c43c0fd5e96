// CPU kernels of sources, state and plumbing.
#pragma once

#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <mutex>
#include <numeric>

namespace loom::detail {

template <class T> struct constant_cpu {
  static void run(kernel_context& c) { c.output = c.node.attr<any_tensor>("value"); }
};

// Reading a variable shares its buffer; the executor clones a fetched
// variable so that later updates never change a value already returned.
template <class T> struct variable_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = c.resources.variable(c.node);
    std::lock_guard lock(v.mu);
    if (!v.initialized)
      throw failed_precondition_error("attempting to use uninitialized value " + c.node.name +
                                      " (run its initializer, or "
                                      "global_variables_initializer, first)");
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
    } else {
      if (!v.initialized)
        throw failed_precondition_error(
            "node " + n.describe() + ": attempting to use uninitialized variable '" +
            n.attr_or<std::string>("_ref_name_0", "?") +
            "' (run its initializer, or global_variables_initializer, first)");
      if (value.shape() != v.value.shape())
        throw invalid_argument_error(
            "node " + n.describe() + ": value of shape " + value.shape().to_string() +
            " does not match the variable's shape " + v.value.shape().to_string());
      if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, bool>) {
        throw invalid_argument_error("node " + n.describe() + ": no arithmetic on " +
                                     std::string(to_string(dtype_of<T>)));
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
      }
    }
    c.output = v.value;
  }
};

template <class T> struct identity_cpu {
  static void run(kernel_context& c) { c.output = c.input(0); }
};

template <class T> struct no_op_cpu {
  static void run(kernel_context&) {}
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
    const int r = from.rank(), pad = r - to.rank();
    if (pad < 0)
      throw invalid_argument_error("node " + c.node.describe() + ": cannot reduce " +
                                   from.to_string() + " to " + to.to_string());
    // Row-major strides of dy and of the target (with broadcast dims at stride 0).
    std::vector<std::int64_t> to_stride(static_cast<std::size_t>(r), 0);
    std::int64_t s = 1;
    for (int i = r - 1; i >= 0; --i) {
      const std::int64_t td = i >= pad ? to[i - pad] : 1;
      if (td != 1 && td != from[i])
        throw invalid_argument_error("node " + c.node.describe() + ": cannot reduce " +
                                     from.to_string() + " to " + to.to_string());
      to_stride[static_cast<std::size_t>(i)] = td == 1 ? 0 : s;
      s *= td;
    }
    c.output = any_tensor(dy.type(), to);
    T* out = c.output.data<T>();
    std::fill_n(out, c.output.num_elements(), T(0));
    const T* in = dy.data<T>();
    const std::int64_t n = dy.num_elements();
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

inline bool register_state_kernels() {
  register_kernels<constant_cpu>("constant", all_types{});
  register_kernels<variable_cpu>("variable", all_types{});
  for (const char* op : {"assign", "assign_add", "assign_sub"})
    register_kernels<assign_cpu>(op, all_types{});
  register_kernels<identity_cpu>("identity", all_types{});
  register_kernels<no_op_cpu>("no_op", all_types{});
  register_kernels<fill_like_cpu>("zeros_like", numeric_types{});
  register_kernels<fill_like_cpu>("ones_like", numeric_types{});
  register_kernels<sum_to_shape_cpu>("sum_to_shape", numeric_types{});
  return true;
}

inline const bool state_kernels_registered = register_state_kernels();

} // namespace loom::detail
