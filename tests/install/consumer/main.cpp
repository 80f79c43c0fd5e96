// Downstream consumer of an installed loom (see cmake/test_install.cmake): what a
// real program does with the package. It builds a linear model, initializes its
// variables and trains one gradient descent step through loom::session, so the
// kernels and the runtime are all there: the step must lower the loss and change
// the weights.
//
// Built two ways. By its CMake project, linking loom::kernels, which defines
// LOOM_COMPILED_KERNELS: <loom/loom.hpp> is then the API alone, and the kernels
// come from the package's loom_kernels.cpp, compiled once in the consumer's tree.
// By hand, one compiler command and no library: <loom/loom.hpp> compiles them.
#if defined(LOOM_CONSUMER_LINKS_KERNELS) && !defined(LOOM_COMPILED_KERNELS)
#error "loom::kernels did not give its consumer LOOM_COMPILED_KERNELS"
#endif
#include <loom/loom.hpp>

#include <cstdio>
#include <exception>
#include <string_view>
#include <vector>

int main() try {
#ifdef LOOM_PACKAGE_VERSION
  if (loom::version() != std::string_view(LOOM_PACKAGE_VERSION)) {
    std::printf("loom_consumer: FAILED: the headers say loom %s, the package %s\n",
                LOOM_VERSION_STRING, LOOM_PACKAGE_VERSION);
    return 1;
  }
#endif
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{-1, 2}, "x");
  loom::placeholder<float, 2> y(g, loom::shape{-1, 1}, "y");
  loom::variable<float, 2> w(g, "w", loom::shape{2, 1}, loom::zeros_initializer{});
  loom::variable<float, 1> b(g, "b", loom::shape{1}, loom::zeros_initializer{});
  auto loss = loom::reduce_mean(loom::square(loom::xw_plus_b(x, w, b) - y));
  auto train = loom::gradient_descent_optimizer{0.1}.minimize(loss);

  // y = 2 x0 - x1 + 0.5: from w = 0, b = 0 one step must lower the squared error.
  const loom::tensor<float, 2> xs(loom::shape{4, 2}, std::vector<float>{1, 0, 0, 1, 1, 1, 2, 1});
  const loom::tensor<float, 2> ys(loom::shape{4, 1}, std::vector<float>{2.5f, -0.5f, 1.5f, 3.5f});

  loom::session sess(g);
  sess.run(loom::global_variables_initializer(g));
  const float before = static_cast<float>(sess.run(loss, {{x, xs}, {y, ys}}));
  sess.run(train, {{x, xs}, {y, ys}});
  const float after = static_cast<float>(sess.run(loss, {{x, xs}, {y, ys}}));
  const auto w_after = sess.run(w);

  std::printf("loom_consumer: loom %s: loss %.4f -> %.4f after one step, w = [%.4f, %.4f]\n",
              LOOM_VERSION_STRING, static_cast<double>(before), static_cast<double>(after),
              static_cast<double>(w_after(0, 0)), static_cast<double>(w_after(1, 0)));
  if (!(after < before) || (w_after(0, 0) == 0.0f && w_after(1, 0) == 0.0f)) {
    std::puts("loom_consumer: FAILED: the training step did not lower the loss and move w");
    return 1;
  }
#ifdef LOOM_COMPILED_KERNELS
  std::puts("loom_consumer: ok: trained one step against the installed loom (loom::kernels)");
#else
  std::puts("loom_consumer: ok: trained one step against the installed loom (by hand, "
            "header-only)");
#endif
  return 0;
} catch (const std::exception& e) {
  std::printf("loom_consumer: FAILED: %s\n", e.what());
  return 1;
}
