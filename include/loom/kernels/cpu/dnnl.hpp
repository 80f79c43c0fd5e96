// oneDNN (Debian's libdnnl-dev) as the CPU's float convolution: conv2d and its two backprops
// on NHWC tensors and HWIO filters, with TF's padding (a detail::conv_window's leading padding, the
// trailing padding what the output size leaves), strides and dilations. Compiled where
// LOOM_HAVE_DNNL is defined: CMake defines it for loom::kernels where it finds oneDNN, and
// links -ldnnl. kernels/cpu/conv.hpp runs im2col plus GEMM where it is not, and for double
// always (oneDNN has no f64 convolution).
//
// A primitive is made once per shape: oneDNN's JIT kernels are generated when a primitive is
// created (milliseconds), so the primitives, with the weights' reorders, are cached by the
// whole geometry, the pass and the thread count (a bounded LRU, under a mutex; made outside
// it). Every primitive takes its scratchpad from the caller (scratchpad_mode::user), so one
// primitive may run on several threads at once, as the executor's kernels do.
//
// Threads: an OpenMP team the size of the session's intra-op pool (kernels/cpu/dnnl_team.hpp).
#pragma once

#include <loom/graph/ops/conv.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>

#include <loom/kernels/cpu/dnnl_team.hpp>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

namespace loom::kernels::dnnl_conv {

enum class pass { forward, backward_data, backward_weights };

// What a primitive depends on: the pass, the thread count (oneDNN splits its work when it
// makes the primitive) and the whole geometry.
struct key {
  pass which;
  int threads;
  std::array<std::int64_t, 15> geometry;
  auto operator<=>(const key&) const = default;
};

inline key key_of(pass which, int threads, const detail::conv_window& w) {
  return {which,
          threads,
          {w.batch, w.in_h, w.in_w, w.in_c, w.window_h, w.window_w, w.out_c, w.out_h, w.out_w,
           w.stride_h, w.stride_w, w.dilation_h, w.dilation_w, w.pad_top, w.pad_left}};
}

// A cached convolution: the primitive, its scratchpad's size, and the reorder between the
// filter's HWIO and the layout the primitive chose for it (none where they are the same).
struct entry {
  dnnl::primitive conv;
  dnnl::memory::desc filter_user, filter_primitive, scratchpad;
  dnnl::primitive reorder;
  dnnl::memory::desc reorder_scratchpad;
  bool reorders = false;
};

inline const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The primitives this process made, at most `capacity`, the least recently used dropped.
class cache {
public:
  static constexpr std::size_t capacity = 64;

  std::shared_ptr<const entry> find(const key& k) {
    const std::lock_guard lock(mutex_);
    const auto it = entries_.find(k);
    if (it == entries_.end())
      return nullptr;
    order_.splice(order_.begin(), order_, it->second.second);
    return it->second.first;
  }
  // Adds e under k unless another thread did first; returns the one cached.
  std::shared_ptr<const entry> add(const key& k, std::shared_ptr<const entry> e) {
    const std::lock_guard lock(mutex_);
    if (const auto it = entries_.find(k); it != entries_.end())
      return it->second.first;
    order_.push_front(k);
    entries_.emplace(k, std::pair{e, order_.begin()});
    ++made_;
    if (entries_.size() > capacity) {
      entries_.erase(order_.back());
      order_.pop_back();
    }
    return e;
  }
  std::size_t size() {
    const std::lock_guard lock(mutex_);
    return entries_.size();
  }
  // How many this process made (and cached) so far, dropped ones included.
  std::size_t made() {
    const std::lock_guard lock(mutex_);
    return made_;
  }

private:
  std::mutex mutex_;
  std::size_t made_ = 0;
  std::list<key> order_; // most recently used first
  std::map<key, std::pair<std::shared_ptr<const entry>, std::list<key>::iterator>> entries_;
};

inline cache& primitives() {
  static cache c;
  return c;
}

// Memory for a call: 64-byte aligned, as oneDNN prefers, freed at the end of the call.
struct buffer {
  struct release {
    void operator()(void* p) const { std::free(p); }
  };
  explicit buffer(std::size_t bytes)
      : data(bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr) {
    if (bytes && !data)
      throw std::bad_alloc();
  }
  std::unique_ptr<void, release> data;
};

inline dnnl::memory::desc nhwc(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c) {
  return {{n, c, h, w}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc};
}

inline std::shared_ptr<const entry> make(pass which, const detail::conv_window& w) {
  using dnnl::memory;
  using tag = memory::format_tag;
  const memory::dims filter_dims{w.out_c, w.in_c, w.window_h, w.window_w};
  const memory::desc x = nhwc(w.batch, w.in_h, w.in_w, w.in_c),
                     y = nhwc(w.batch, w.out_h, w.out_w, w.out_c),
                     hwio(filter_dims, memory::data_type::f32, tag::hwio),
                     any(filter_dims, memory::data_type::f32, tag::any);
  // TF's padding: the leading padding the window has, the trailing what the output needs
  // (none where VALID's output drops the input's last rows).
  auto trailing = [](std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t d,
                     std::int64_t out, std::int64_t lead) {
    return std::max<std::int64_t>((out - 1) * s + (k - 1) * d + 1 - in - lead, 0);
  };
  const memory::dims strides{w.stride_h, w.stride_w}, dilations{w.dilation_h - 1, w.dilation_w - 1},
      lead{w.pad_top, w.pad_left},
      trail{trailing(w.in_h, w.window_h, w.stride_h, w.dilation_h, w.out_h, w.pad_top),
            trailing(w.in_w, w.window_w, w.stride_w, w.dilation_w, w.out_w, w.pad_left)};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto alg = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc forward(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, any, y, strides,
                                      dilations, lead, trail),
      attr, engine());
  auto e = std::make_shared<entry>();
  e->filter_user = hwio;
  if (which == pass::forward) {
    e->conv = dnnl::convolution_forward(forward);
    e->filter_primitive = forward.weights_desc();
    e->scratchpad = forward.scratchpad_desc();
  } else if (which == pass::backward_data) {
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(alg, x, any, y, strides, dilations, lead, trail),
        attr, engine(), forward);
    e->conv = dnnl::convolution_backward_data(pd);
    e->filter_primitive = pd.weights_desc();
    e->scratchpad = pd.scratchpad_desc();
  } else {
    const dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(alg, x, any, y, strides, dilations, lead, trail),
        attr, engine(), forward);
    e->conv = dnnl::convolution_backward_weights(pd);
    e->filter_primitive = pd.diff_weights_desc();
    e->scratchpad = pd.scratchpad_desc();
  }
  e->reorders = e->filter_primitive != hwio;
  if (e->reorders) {
    // Into the primitive's layout before the pass, back into HWIO after the filter's gradient.
    const bool into = which != pass::backward_weights;
    const dnnl::reorder::primitive_desc pd(engine(), into ? hwio : e->filter_primitive, engine(),
                                           into ? e->filter_primitive : hwio, attr);
    e->reorder = dnnl::reorder(pd);
    e->reorder_scratchpad = pd.scratchpad_desc();
  }
  return e;
}

// The cached primitive of this pass and geometry on `threads` threads; nullptr where oneDNN
// has none for it (remembered, so the caller's fallback is not a failed creation each call).
inline std::shared_ptr<const entry> get(pass which, int threads, const detail::conv_window& w) {
  const key k = key_of(which, threads, w);
  if (auto e = primitives().find(k))
    return e->conv ? e : nullptr;
  std::shared_ptr<const entry> made;
  try {
    made = make(which, w);
  } catch (const dnnl::error&) {
    made = std::make_shared<entry>(); // no primitive: the caller runs im2col
  }
  made = primitives().add(k, std::move(made));
  return made->conv ? made : nullptr;
}

// Runs one pass: x (or dx), y (or dy) and the filter (or its gradient) in TF's layouts. False
// where oneDNN cannot (an empty dimension, no primitive): the caller computes it.
inline bool run(const cpu_device& d, pass which, const detail::conv_window& w, float* x,
                float* filter, float* y) {
  if (w.batch <= 0 || w.in_c <= 0 || w.out_c <= 0 || w.out_h <= 0 || w.out_w <= 0 || w.in_h <= 0 ||
      w.in_w <= 0)
    return false;
  const int threads = dnnl_team::use_pool_size(d);
  const auto e = get(which, threads, w);
  if (!e)
    return false;
  const dnnl::engine& eng = engine();
  thread_local dnnl::stream stream(eng);
  const dnnl::memory xm(nhwc(w.batch, w.in_h, w.in_w, w.in_c), eng, x),
      ym(nhwc(w.batch, w.out_h, w.out_w, w.out_c), eng, y), user(e->filter_user, eng, filter);
  buffer reordered(e->reorders ? e->filter_primitive.get_size() : 0),
      scratch(std::max(e->scratchpad.get_size(),
                       e->reorders ? e->reorder_scratchpad.get_size() : std::size_t{0}));
  const dnnl::memory fm =
      e->reorders ? dnnl::memory(e->filter_primitive, eng, reordered.data.get()) : user;
  const dnnl::memory sm(e->scratchpad, eng, scratch.data.get());
  auto reorder = [&](const dnnl::memory& from, const dnnl::memory& to) {
    const dnnl::memory rs(e->reorder_scratchpad, eng, scratch.data.get());
    e->reorder.execute(stream,
                       {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, rs}});
  };
  switch (which) {
  case pass::forward:
    if (e->reorders)
      reorder(user, fm);
    e->conv.execute(stream, {{DNNL_ARG_SRC, xm},
                             {DNNL_ARG_WEIGHTS, fm},
                             {DNNL_ARG_DST, ym},
                             {DNNL_ARG_SCRATCHPAD, sm}});
    break;
  case pass::backward_data:
    if (e->reorders)
      reorder(user, fm);
    e->conv.execute(stream, {{DNNL_ARG_DIFF_DST, ym},
                             {DNNL_ARG_WEIGHTS, fm},
                             {DNNL_ARG_DIFF_SRC, xm},
                             {DNNL_ARG_SCRATCHPAD, sm}});
    break;
  case pass::backward_weights:
    e->conv.execute(stream, {{DNNL_ARG_SRC, xm},
                             {DNNL_ARG_DIFF_DST, ym},
                             {DNNL_ARG_DIFF_WEIGHTS, fm},
                             {DNNL_ARG_SCRATCHPAD, sm}});
    if (e->reorders)
      reorder(fm, user);
    break;
  }
  stream.wait();
  return true;
}

// y = conv2d(x, filter).
inline bool forward(const cpu_device& d, const detail::conv_window& w, const float* x,
                    const float* filter, float* y) {
  return run(d, pass::forward, w, const_cast<float*>(x), const_cast<float*>(filter), y);
}
// dx from the filter and dy.
inline bool backward_data(const cpu_device& d, const detail::conv_window& w, const float* filter,
                          const float* dy, float* dx) {
  return run(d, pass::backward_data, w, dx, const_cast<float*>(filter), const_cast<float*>(dy));
}
// The filter's gradient from x and dy.
inline bool backward_weights(const cpu_device& d, const detail::conv_window& w, const float* x,
                             const float* dy, float* df) {
  return run(d, pass::backward_weights, w, const_cast<float*>(x), df, const_cast<float*>(dy));
}

} // namespace loom::kernels::dnnl_conv
