// CPU kernels of the summary ops (graph/ops/summary.hpp): each writes a
// serialized Summary (core/summary_format.hpp) into a string scalar. CPU only,
// as TF's (graph/ops/summary.hpp says why).
#pragma once

#include <loom/core/summary_format.hpp>
#include <loom/graph/ops/summary.hpp>
#include <loom/kernels/registry.hpp>

#include <cmath>
#include <set>
#include <string>

namespace loom::kernels {

inline any_tensor string_scalar(std::string s) {
  any_tensor out(dtype::string, loom::shape{});
  *out.data<std::string>() = std::move(s);
  return out;
}

template <class T> struct scalar_summary_cpu {
  static void run(kernel_context& c) {
    // A NaN is written as it is: TensorBoard shows it, and a diverging loss is
    // what a user watches for (TF writes it too).
    const auto v = static_cast<float>(*c.input(0).data<T>());
    c.output =
        string_scalar(detail::summary_format::scalar_summary(c.node.attr<std::string>("tag"), v));
  }
};

template <class T> struct histogram_summary_cpu {
  static void run(kernel_context& c) {
    const any_tensor& in = c.input(0);
    const T* v = in.data<T>();
    const std::string& tag = c.node.attr<std::string>("tag");
    detail::summary_format::histogram h;
    for (std::int64_t i = 0, n = in.num_elements(); i < n; ++i) {
      const auto x = static_cast<double>(v[i]);
      if (!std::isfinite(x)) // TF's HistogramSummaryOp refuses them too: no bucket holds them
        throw invalid_argument_error("node " + c.node.describe() + ": " +
                                     (std::isnan(x) ? "NaN" : "infinity") +
                                     " in summary histogram for tag '" + tag + "' at element " +
                                     std::to_string(i) + " of " + in.describe());
      h.add(x);
    }
    c.output = string_scalar(detail::summary_format::histogram_summary(tag, h));
  }
};

template <class T> struct merge_summary_cpu {
  static void run(kernel_context& c) {
    std::string merged;
    std::set<std::string, std::less<>> seen;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      const std::string& s = *c.input(i).data<std::string>();
      for (auto& tag : detail::summary_format::summary_tags(s, "summary " + std::to_string(i) +
                                                                   " of node " + c.node.describe()))
        if (!seen.insert(tag).second)
          throw invalid_argument_error("node " + c.node.describe() + ": duplicate tag '" + tag +
                                       "' in the summaries it merges");
      merged += s; // concatenated Summaries are their merge (core/summary_format.hpp)
    }
    c.output = string_scalar(std::move(merged));
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_summary_kernels() {
  register_kernels<scalar_summary_cpu>("scalar_summary", numeric_types{});
  register_kernels<histogram_summary_cpu>("histogram_summary", numeric_types{});
  register_kernels<merge_summary_cpu>("merge_summary", type_list<std::string>{});
  return true;
}

inline const bool summary_kernels_registered = register_summary_kernels();
#endif

} // namespace loom::kernels
