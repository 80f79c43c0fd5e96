// docs/ops.md from the registries themselves: every op this build registers, with its
// inputs, whether it has an output, a gradient, state, whether it fuses, and the dtypes of
// its CPU and GPU kernels. So the reference is what the code is, and `make test` fails
// when it drifts (the ops_reference test runs --check).
//
//   ops_reference                  the page, on stdout
//   ops_reference --write FILE     writes it
//   ops_reference --check FILE     exits 1 (naming the first line that differs) unless FILE
//                                  is the page; a build without CUDA checks every column
//                                  but the GPU one, which it cannot know
#include <loom/loom.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

#if defined(LOOM_OPS_REFERENCE_HAS_CUDA)
constexpr bool knows_gpu = true;
#else
constexpr bool knows_gpu = false;
#endif

// The dtypes `op` has a kernel for on `device`, as "float32, int64", or "—".
std::string kernel_dtypes(const std::string& op, const char* device) {
  const auto& kernels = loom::kernels::kernel_registry::instance();
  std::string out;
  for (loom::dtype t : {loom::dtype::f32, loom::dtype::f64, loom::dtype::i32, loom::dtype::i64,
                        loom::dtype::boolean, loom::dtype::string})
    if (kernels.find(op, t, device))
      out += (out.empty() ? "" : ", ") + std::string(loom::to_string(t));
  return out.empty() ? "—" : out;
}

std::string page() {
  const auto& ops = loom::detail::op_registry::instance();
  std::ostringstream md;
  md << "# Op reference\n\n"
        "Every op loom registers, generated from the op and kernel registries by\n"
        "`build/tools/ops_reference --write docs/ops.md`; `make test` fails where this page and\n"
        "the code differ (the `ops_reference` test). The C++ functions that make these nodes, and\n"
        "the TensorFlow API each matches, are in [from-tensorflow.md](from-tensorflow.md).\n\n"
        "- inputs: the number of data inputs (`any`: a list);\n"
        "- gradient: `yes` where automatic differentiation passes through it;\n"
        "- notes: `no output` (run for its effect), `stateful` (never merged with a twin),\n"
        "  `fuses` (elementwise: fused with its neighbours into one kernel), `ref` (takes a\n"
        "  variable itself), `blocking` (may wait for other steps);\n"
        "- CPU, GPU: the dtypes of its kernels (`—`: none; elementwise ops also run inside fused\n"
        "  kernels for float32 and float64).\n\n"
        "| op | inputs | gradient | notes | CPU | GPU |\n"
        "|---|---|---|---|---|---|\n";
  for (const std::string& name : ops.names()) {
    const loom::detail::op_def& d = ops.find(name);
    std::vector<std::string> notes;
    if (d.no_output)
      notes.emplace_back("no output");
    if (d.stateful)
      notes.emplace_back("stateful");
    if (d.elementwise)
      notes.emplace_back("fuses");
    if (d.ref_inputs != 0)
      notes.emplace_back("ref");
    if (d.blocking)
      notes.emplace_back("blocking");
    std::string joined;
    for (const auto& n : notes)
      joined += (joined.empty() ? "" : ", ") + n;
    md << "| `" << name << "` | " << (d.num_inputs < 0 ? "any" : std::to_string(d.num_inputs))
       << " | " << (d.gradient ? "yes" : "no") << " | " << (joined.empty() ? "—" : joined) << " | "
       << kernel_dtypes(name, loom::kernels::device_cpu) << " | "
       << kernel_dtypes(name, loom::kernels::device_gpu) << " |\n";
  }
  return md.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

// A table row without its last cell (the GPU column), for a build that cannot know it.
std::string without_gpu(const std::string& line) {
  if (line.rfind("| `", 0) != 0)
    return line;
  const auto last = line.rfind(" | ", line.size() - 3);
  return last == std::string::npos ? line : line.substr(0, last);
}

int check(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "ops_reference: cannot read " << path << "\n";
    return 1;
  }
  const std::string file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto want = lines_of(page());
  const auto have = lines_of(file);
  for (std::size_t i = 0; i < std::max(want.size(), have.size()); ++i) {
    const std::string w = i < want.size() ? want[i] : "<end of page>";
    const std::string h = i < have.size() ? have[i] : "<end of file>";
    if (knows_gpu ? w == h : without_gpu(w) == without_gpu(h))
      continue;
    std::cerr << path << ":" << i + 1 << ": differs from the registries:\n  file: " << h
              << "\n  code: " << w
              << "\nrun `build/tools/ops_reference --write docs/ops.md` and commit it\n";
    return 1;
  }
  std::cout << "ops_reference: " << path << " lists the "
            << loom::detail::op_registry::instance().names().size()
            << " registered ops as the code has them"
            << (knows_gpu ? "" : " (the GPU column unchecked: a build without CUDA)") << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode.empty()) {
    std::cout << page();
    return 0;
  }
  if ((mode == "--write" || mode == "--check") && argc == 3) {
    if (mode == "--check")
      return check(argv[2]);
    if (!knows_gpu) {
      std::cerr << "ops_reference: this build has no CUDA, so it cannot write the GPU column; "
                   "write the page from a build with CUDA\n";
      return 1;
    }
    std::ofstream out(argv[2]);
    out << page();
    return out ? 0 : 1;
  }
  std::cerr << "usage: ops_reference [--write FILE | --check FILE]\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "ops_reference: " << e.what() << "\n";
  return 1;
}
