// Graph serialization with cereal (portable binary, versioned), so a process
// that never saw the user's C++ types can rebuild the runtime graph and run it
// through its kernel registry. Loading validates everything: a corrupt or
// hostile byte stream gives a data_loss_error, never a crash.
#pragma once

#include <loom/core/bounded_archive.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>

#include <cereal/archives/json.hpp>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>

#include <cstring>
#include <sstream>
#include <string>

namespace loom {

// Tensors: dtype, shape, then the elements (strings one by one; arithmetic
// elements as one binary blob in the archive's byte order).
template <class Archive> void save(Archive& ar, const any_tensor& t) {
  const bool present = !t.empty();
  ar(present);
  if (!present)
    return;
  ar(t.type(), t.shape());
  visit_dtype(t.type(), [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string>) {
      for (const auto& s : t.flat<std::string>())
        ar(s);
    } else if constexpr (std::is_same_v<T, bool>) {
      for (bool b : t.flat<bool>())
        ar(b);
    } else {
      for (T v : t.flat<T>())
        ar(v);
    }
  });
}

template <class Archive> void load(Archive& ar, any_tensor& t) {
  bool present = false;
  ar(present);
  if (!present) {
    t = {};
    return;
  }
  dtype d{};
  loom::shape s;
  ar(d, s);
  if (static_cast<unsigned>(d) > static_cast<unsigned>(dtype::string))
    throw data_loss_error("serialized tensor has an unknown dtype tag " +
                          std::to_string(static_cast<unsigned>(d)));
  // The element count, checked as it grows (a product of hostile dimensions
  // must not overflow), then against the bytes left where the archive knows
  // them: the tensor is allocated before its elements are read.
  std::uint64_t count = 1;
  for (auto dim : s.dims()) {
    if (dim < 0 || (dim != 0 && count > (std::uint64_t{1} << 31) / static_cast<std::uint64_t>(dim)))
      throw data_loss_error("serialized tensor has an invalid shape " + s.to_string());
    count *= static_cast<std::uint64_t>(dim);
  }
  if constexpr (std::is_same_v<Archive, detail::bounded_input_archive>) {
    // A string element takes its 8-byte length at least; the others their size.
    const std::size_t min_bytes = d == dtype::string ? 8 : size_of(d);
    if (count > ar.remaining() / min_bytes)
      throw data_loss_error("serialized tensor " + std::string(to_string(d)) + s.to_string() +
                            " of " + std::to_string(count) + " elements, to start at offset " +
                            std::to_string(ar.offset()) + ", but only " +
                            std::to_string(ar.remaining()) + " bytes follow");
  }
  any_tensor out(d, s);
  visit_dtype(d, [&]<class T>() {
    for (T& v : out.flat<T>())
      ar(v);
  });
  t = std::move(out);
}

template <class Archive> void serialize(Archive& ar, node_def& n, std::uint32_t /*version*/) {
  ar(cereal::make_nvp("id", n.id), cereal::make_nvp("op", n.op), cereal::make_nvp("name", n.name),
     cereal::make_nvp("dtype", n.type), cereal::make_nvp("shape", n.shape),
     cereal::make_nvp("attrs", n.attrs), cereal::make_nvp("inputs", n.inputs),
     cereal::make_nvp("control_inputs", n.control_inputs),
     cereal::make_nvp("requested_device", n.requested_device),
     cereal::make_nvp("assigned_device", n.assigned_device),
     cereal::make_nvp("colocation_group", n.colocation_group));
}

namespace detail {

template <class Archive> void serialize(Archive& ar, fusion_candidate& c) {
  ar(cereal::make_nvp("root", c.root), cereal::make_nvp("key", c.key),
     cereal::make_nvp("leaves", c.leaves));
}

inline constexpr std::uint32_t graph_format_version = 1;

struct graph_image {
  std::uint32_t version = graph_format_version;
  std::vector<node_def> nodes;
  std::map<std::string, std::vector<node_id>, std::less<>> collections;
  std::vector<fusion_candidate> fusions;
  std::optional<std::int64_t> seed;
  std::map<std::string, node_id, std::less<>> variable_store;

  template <class Archive> void serialize(Archive& ar) {
    ar(cereal::make_nvp("format_version", version));
    if (version != graph_format_version)
      throw data_loss_error("serialized graph has format version " + std::to_string(version) +
                            ", this build reads version " + std::to_string(graph_format_version));
    ar(cereal::make_nvp("nodes", nodes), cereal::make_nvp("collections", collections),
       cereal::make_nvp("fusions", fusions), cereal::make_nvp("seed", seed),
       cereal::make_nvp("variable_store", variable_store));
  }
};

LOOM_COMPILED_ONCE graph_image image_of(const graph& g);

// Rebuilds a graph, checking what a byte stream could get wrong: ids, edges
// that point forward or out of range, unknown ops, duplicate names.
LOOM_COMPILED_ONCE graph graph_from_image(graph_image&& img);

} // namespace detail

// Portable binary bytes of a graph (compiled once: writing a graph_image instantiates
// cereal's archive for every member, a second of clang's time in each unit).
LOOM_COMPILED_ONCE std::string serialize_graph(const graph& g);

// Reads with bounded_input_archive: the bytes may come from a peer
// (register_graph), whose declared sizes must not allocate past what it sent.
LOOM_COMPILED_ONCE graph deserialize_graph(std::string_view bytes);

// A readable JSON dump, for debugging and docs.
LOOM_COMPILED_ONCE std::string graph_to_json(const graph& g);

} // namespace loom

CEREAL_CLASS_VERSION(loom::node_def, 1);

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE std::string serialize_graph(const graph& g) {
  std::ostringstream os;
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(detail::image_of(g));
  }
  return os.str();
}

} // namespace loom

namespace loom::detail {

LOOM_COMPILED_ONCE graph_image image_of(const graph& g) {
  const auto& st = g.state();
  return {graph_format_version,
          std::vector<node_def>(st.nodes.begin(), st.nodes.end()),
          st.collections,
          st.fusions,
          st.seed,
          st.variable_store};
}

LOOM_COMPILED_ONCE graph graph_from_image(graph_image&& img) {
  graph g;
  auto& st = g.state();
  const auto n = static_cast<node_id>(img.nodes.size());
  auto check_ref = [&](node_id ref, node_id limit, const std::string& what) {
    if (ref < 0 || ref >= limit)
      throw data_loss_error("serialized graph: " + what + " refers to node " + std::to_string(ref) +
                            " (valid: 0.." + std::to_string(limit - 1) + ")");
  };
  for (node_id i = 0; i < n; ++i) {
    node_def& nd = img.nodes[static_cast<std::size_t>(i)];
    if (nd.id != i)
      throw data_loss_error("serialized graph: node " + std::to_string(i) + " carries id " +
                            std::to_string(nd.id));
    if (!op_registry::instance().contains(nd.op))
      throw not_found_error("serialized graph: node '" + nd.name + "' uses op '" + nd.op +
                            "', which is not registered in this process");
    for (node_id in : nd.inputs)
      check_ref(in, i, "an input of node '" + nd.name + "'");
    for (node_id in : nd.control_inputs)
      check_ref(in, i, "a control input of node '" + nd.name + "'");
    // Kernels index their inputs and switch on dtypes without checking again.
    const int arity = op_registry::instance().find(nd.op).num_inputs;
    if (arity >= 0 && static_cast<std::size_t>(arity) != nd.inputs.size())
      throw data_loss_error("serialized graph: node '" + nd.name + "' (" + nd.op + ") has " +
                            std::to_string(nd.inputs.size()) + " inputs, the op takes " +
                            std::to_string(arity));
    auto check_dtype = [&](dtype d, const std::string& what) {
      if (static_cast<unsigned>(d) > static_cast<unsigned>(dtype::string))
        throw data_loss_error("serialized graph: " + what + " of node '" + nd.name +
                              "' has an unknown dtype tag " +
                              std::to_string(static_cast<unsigned>(d)));
    };
    auto check_shape = [&](const loom::shape& s, const std::string& what) {
      for (auto d : s.dims())
        if (d < shape::unknown)
          throw data_loss_error("serialized graph: " + what + " of node '" + nd.name +
                                "' has a negative dimension " + std::to_string(d));
    };
    check_dtype(nd.type, "the dtype");
    check_shape(nd.shape, "the shape");
    for (const auto& [key, value] : nd.attrs) {
      if (auto* d = std::get_if<dtype>(&value))
        check_dtype(*d, "attribute '" + key + "'");
      if (auto* s = std::get_if<loom::shape>(&value))
        check_shape(*s, "attribute '" + key + "'");
    }
    if (!st.by_name.emplace(nd.name, i).second)
      throw data_loss_error("serialized graph: two nodes are named '" + nd.name + "'");
    st.name_uses.emplace(nd.name, 0);
    st.nodes.push_back(std::move(nd));
  }
  for (auto& [name, ids] : img.collections)
    for (node_id id : ids)
      check_ref(id, n, "collection '" + name + "'");
  for (auto& f : img.fusions) {
    check_ref(f.root, n, "a fusion region");
    for (node_id l : f.leaves)
      check_ref(l, n, "a fusion region");
    st.fusion_by_root.emplace(f.root, st.fusions.size());
    st.fusions.push_back(std::move(f));
  }
  for (auto& [name, id] : img.variable_store)
    check_ref(id, n, "variable '" + name + "'");
  st.collections = std::move(img.collections);
  st.seed = img.seed;
  st.variable_store = std::move(img.variable_store);
  st.version = 1;
  return g;
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE graph deserialize_graph(std::string_view bytes) {
  detail::graph_image img;
  try {
    detail::bounded_input_archive ar(bytes);
    ar(img);
  } catch (const error& e) {
    // The graph's own checks name the graph; the archive's name only the offset.
    if (e.message().find("serialized") != std::string::npos)
      throw;
    throw data_loss_error("serialized graph is corrupt: " + e.message());
  } catch (const std::exception& e) {
    throw data_loss_error(std::string("serialized graph is corrupt: ") + e.what());
  }
  return detail::graph_from_image(std::move(img));
}

LOOM_COMPILED_ONCE std::string graph_to_json(const graph& g) {
  std::ostringstream os;
  {
    cereal::JSONOutputArchive ar(os);
    ar(cereal::make_nvp("graph", detail::image_of(g)));
  }
  return os.str();
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
