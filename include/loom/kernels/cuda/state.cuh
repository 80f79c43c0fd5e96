// GPU kernels of sources, state and plumbing (kernels/cpu/state.hpp on the CPU):
// constant, variable, assign / assign_add / assign_sub, is_variable_initialized,
// identity, no_op, fill, zeros_like / ones_like and sum_to_shape.
//
// A variable whose node is placed on a GPU keeps its value in that GPU's
// memory: assign stores the (device) value it is given, and the updates run
// in place there. Reading a variable whose value is still on the host (set by
// a CPU kernel, e.g. a restore) gives a device copy and leaves the variable as
// it is; updating one in place refuses, naming the variable and where it lives.
#pragma once

#include <loom/graph/ops/state.hpp>
#include <loom/kernels/checks/state.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/math.cuh>
#include <loom/kernels/metadata.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::kernels::cuda_kernels {

// Throws unless the variable's value lives on this GPU (an update in place, or
// a gather of its rows by reference, needs it there); `use` says what the node
// does with it.
inline void check_on_gpu(const kernel_context& c, const any_tensor& value, const std::string& what,
                         const char* use = "updated") {
  const gpu_context& g = gpu_of(c);
  if (!on_this_gpu(g, value))
    throw failed_precondition_error(
        "node " + c.node.describe() + " runs on GPU:" + std::to_string(g.device) + ", but " + what +
        " is " + value.describe() + (value.on_host() ? " on the host" : "") + ": a variable " +
        use +
        " on a GPU must live there (place the variable, its initializer "
        "and its updates on that GPU, or all on the CPU)");
}

// Small constants travel as a kernel argument (no copy from pageable memory).
struct small_blob {
  static constexpr std::size_t capacity = 256;
  unsigned char bytes[capacity];
};

__global__ void copy_blob_kernel(unsigned char* out, small_blob b, std::size_t n) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = b.bytes[i];
}

template <class T> struct constant_gpu {
  static void run(kernel_context& c) {
    const any_tensor& v = c.node.attr<any_tensor>("value");
    const gpu_context& g = gpu_of(c);
    if (!v.on_host()) { // a constant made from a device value
      if (!on_this_gpu(g, v))
        throw internal_error("node " + c.node.describe() + ": its value is " + v.describe());
      c.output = v;
      return;
    }
    if (v.byte_size() == 0 || v.byte_size() > small_blob::capacity) {
      c.output = g.upload(v);
      return;
    }
    c.output = g.allocate(v.type(), v.shape());
    small_blob b{};
    std::memcpy(b.bytes, v.raw_data(), v.byte_size());
    copy_blob_kernel<<<1, 64, 0, g.stream>>>(static_cast<unsigned char*>(c.output.device_data()), b,
                                             v.byte_size());
    check_launch();
  }
};

// Reading a variable shares its buffer, as on the CPU.
template <class T> struct variable_gpu {
  static void run(kernel_context& c) {
    variable_resource& v = c.resources.variable(c.node);
    std::lock_guard lock(v.mu);
    check_variable_initialized(c.node, v);
    const gpu_context& g = gpu_of(c);
    if (on_this_gpu(g, v.value))
      c.output = v.value;
    else if (v.value.on_host())
      c.output = g.upload(v.value);
    else
      throw failed_precondition_error("variable " + c.node.name + " lives on " +
                                      v.value.location().to_string() +
                                      ", not on GPU:" + std::to_string(g.device));
  }
};

template <class T>
__global__ void add_sub_kernel(T* out, const T* old, const T* d, std::int64_t n, bool add) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = add ? T(old[i] + d[i]) : T(old[i] - d[i]);
}

template <class T> struct assign_gpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    const any_tensor& value = c.input(1);
    const node_def& n = c.node;
    const gpu_context& g = gpu_of(c);
    std::lock_guard lock(v.mu);
    if (n.op == "assign") {
      if (v.initialized && on_this_gpu(g, v.value) && v.value.shape() == value.shape() &&
          v.value.sole_owner()) {
        // Into the variable's own buffer, as TF's Assign copies into an initialized
        // variable: its address stays, which a step replayed from a CUDA graph reads
        // (runtime/captured_step.hpp: Adam's beta powers are assigned every step).
        cuda::copy_device_to_device(static_cast<unsigned char*>(v.value.device_data()),
                                    static_cast<const unsigned char*>(value.device_data()),
                                    value.byte_size(), g.stream);
      } else {
        // A value nothing else holds becomes the variable's buffer; otherwise a
        // copy, so that the variable owns its state (as on the CPU).
        v.value = c.may_forward(1) ? value : g.clone(value);
      }
      v.initialized = true;
    } else {
      check_assign_update(n, v, value);
      if constexpr (std::is_same_v<T, bool>) {
        throw_no_arithmetic(n, dtype_of<T>);
      } else {
        check_on_gpu(c, v.value, "variable '" + n.attr_or<std::string>("_ref_name_0", "?") + "'");
        // In place when nothing else holds the value; otherwise into another
        // buffer, so values read earlier in this step stay as they were.
        any_tensor next =
            v.value.sole_owner() ? v.value : g.allocate(v.value.type(), v.value.shape());
        const std::int64_t count = next.num_elements();
        if (count > 0) {
          add_sub_kernel<T><<<grid_for(count), block_threads, 0, g.stream>>>(
              next.template device_data<T>(), v.value.template device_data<T>(),
              value.template device_data<T>(), count, n.op == "assign_add");
          check_launch();
        }
        v.value = std::move(next);
      }
    }
    c.output = v.value;
  }
};

template <class T> struct is_variable_initialized_gpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    bool initialized;
    {
      std::lock_guard lock(v.mu);
      initialized = v.initialized;
    }
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(dtype::boolean, loom::shape{});
    fill<bool>(g, c.output.template device_data<bool>(), 1, initialized);
  }
};

template <class T> struct fill_like_gpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(x.type(), x.shape());
    fill<T>(g, c.output.template device_data<T>(), c.output.num_elements(),
            c.node.op == "ones_like" ? T(1) : T(0));
  }
};

// An initializer's value, made on the GPU of its variable.
template <class T> struct fill_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(dtype_of<T>, c.node.attr<loom::shape>("shape"));
    fill<T>(g, c.output.template device_data<T>(), c.output.num_elements(),
            static_cast<T>(c.node.attr<double>("value")));
  }
};

// Sums dy over the dimensions that broadcasting expanded to reach x's shape:
// a sum over those axes.
template <class T> struct sum_to_shape_gpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const loom::shape& to = c.input(1).shape();
    if (dy.shape() == to) {
      c.output = dy;
      return;
    }
    const std::vector<char> mask = summed_axes(c.node, dy.shape(), to);
    c.output = reduce<T>(c, dy, mask, to, reducer::sum);
  }
};

inline bool register_state_gpu() {
  register_kernels<constant_gpu>("constant", all_types_but_string{}, device_gpu);
  register_kernels<variable_gpu>("variable", all_types_but_string{}, device_gpu);
  for (const char* op : {"assign", "assign_add", "assign_sub"})
    register_kernels<assign_gpu>(op, all_types_but_string{}, device_gpu);
  register_kernels<is_variable_initialized_gpu>("is_variable_initialized", type_list<bool>{},
                                                device_gpu);
  // Strings never live on a GPU.
  loom::kernels::register_metadata_kernels<all_types_but_string>(device_gpu);
  register_kernels<fill_gpu>("fill", all_types_but_string{}, device_gpu);
  register_kernels<fill_like_gpu>("zeros_like", numeric_types{}, device_gpu);
  register_kernels<fill_like_gpu>("ones_like", numeric_types{}, device_gpu);
  register_kernels<sum_to_shape_gpu>("sum_to_shape", numeric_types{}, device_gpu);
  return true;
}

inline const bool state_gpu_registered = register_state_gpu();

} // namespace loom::kernels::cuda_kernels
