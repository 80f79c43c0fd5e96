// Whether and how a cluster's connections are encrypted (docs/deploying.md, "TLS"): off by
// default; TLS 1.3 keyed by the cluster token (no files: a pre-shared key derived from the
// token); or TLS 1.3 with certificates (this process's certificate and key, and the CA that
// must have signed every peer's). A program takes them from its environment, as it takes
// the cluster token:
//
//   LOOM_TLS=1                   TLS keyed by the cluster token (LOOM_CLUSTER_TOKEN[_FILE])
//   LOOM_TLS_CERT=task.pem       TLS with certificates: this process's certificate chain,
//   LOOM_TLS_KEY=task.key          its private key,
//   LOOM_TLS_CA=ca.pem             and the CA every peer's certificate must be signed by
//
// The three certificate variables go together and turn TLS on by themselves. Every cluster
// program's --tls, --tls_cert, --tls_key and --tls_ca flags set these variables
// (cluster_resolver.hpp), so that the servers and sessions of the process, and the
// processes it starts, all agree. The message layer builds its TLS contexts from a
// tls_settings (net/tls.hpp); servers and sessions take one in their options, nullopt
// meaning "the environment's".
#pragma once

#include <loom/cluster/environment.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

enum class tls_mode {
  off,         // plain TCP
  token,       // TLS 1.3, keyed by the cluster token (an external pre-shared key)
  certificates // TLS 1.3, each side's certificate verified against the CA (mutual TLS)
};

struct tls_settings {
  tls_mode mode = tls_mode::off;
  // With certificates: PEM files.
  std::string cert_file{}; // this process's certificate, or its chain (leaf first)
  std::string key_file{};  // its private key
  std::string ca_file{};   // the CA certificate(s) every peer's certificate must chain to

  static tls_settings keyed_by_token() { return {tls_mode::token, {}, {}, {}}; }
  static tls_settings with_certificates(std::string cert, std::string key, std::string ca) {
    return {tls_mode::certificates, std::move(cert), std::move(key), std::move(ca)};
  }

  bool enabled() const noexcept { return mode != tls_mode::off; }

  // "TLS keyed by the cluster token", as errors and logs say it (never a file's path: a
  // server says it to peers it has not authenticated).
  std::string describe() const {
    switch (mode) {
    case tls_mode::off: return "no TLS";
    case tls_mode::token: return "TLS keyed by the cluster token";
    case tls_mode::certificates: return "TLS with certificates";
    }
    return "TLS";
  }
};

namespace detail::tls_impl {

// "LOOM_TLS_CERT (--tls_cert)": how errors name a setting.
inline std::string setting_name(std::string_view var, std::string_view flag) {
  return std::string(var) + " (--" + std::string(flag) + ")";
}

} // namespace detail::tls_impl

// The settings LOOM_TLS, LOOM_TLS_CERT, LOOM_TLS_KEY and LOOM_TLS_CA give. Throws
// invalid_argument_error naming the variable (and the flag that sets it): a LOOM_TLS that is
// not a boolean, a certificate variable without the other two, LOOM_TLS=0 beside them, a
// file that cannot be read.
LOOM_COMPILED_ONCE tls_settings
tls_settings_from_environment(const environment& env = process_environment());

// The settings to use: the explicit ones when given, else the environment's.
inline tls_settings resolve_tls(const std::optional<tls_settings>& explicit_settings) {
  return explicit_settings ? *explicit_settings : tls_settings_from_environment();
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE tls_settings tls_settings_from_environment(const environment& env) {
  using detail::tls_impl::setting_name;
  const auto value = [&](const char* name) {
    const auto v = env(name);
    return v ? *v : std::string();
  };
  const std::string on = value("LOOM_TLS");
  std::optional<bool> requested;
  if (on == "1" || on == "true" || on == "yes" || on == "on")
    requested = true;
  else if (on == "0" || on == "false" || on == "no" || on == "off")
    requested = false;
  else if (!on.empty())
    throw invalid_argument_error(setting_name("LOOM_TLS", "tls") + " is \"" + on +
                                 "\"; expected 1 (TLS keyed by the cluster token) or 0 (off)");

  struct file_setting {
    const char* var;
    const char* flag;
    std::string path;
  };
  file_setting files[] = {{"LOOM_TLS_CERT", "tls_cert", value("LOOM_TLS_CERT")},
                          {"LOOM_TLS_KEY", "tls_key", value("LOOM_TLS_KEY")},
                          {"LOOM_TLS_CA", "tls_ca", value("LOOM_TLS_CA")}};
  const file_setting* given = nullptr;
  for (const auto& f : files)
    if (!f.path.empty())
      given = &f;
  if (!given)
    return requested.value_or(false) ? tls_settings::keyed_by_token() : tls_settings{};
  if (requested == false)
    throw invalid_argument_error(setting_name("LOOM_TLS", "tls") + " turns TLS off, but " +
                                 setting_name(given->var, given->flag) +
                                 " is set; drop one of them");
  for (const auto& f : files) {
    if (f.path.empty())
      throw invalid_argument_error(
          setting_name(given->var, given->flag) + " is set but " + setting_name(f.var, f.flag) +
          " is not: TLS with certificates needs this process's certificate, its key and the CA "
          "that signed the cluster's certificates");
    if (!std::ifstream(f.path))
      throw invalid_argument_error(setting_name(f.var, f.flag) + " names \"" + f.path +
                                   "\", which cannot be read");
  }
  return tls_settings::with_certificates(files[0].path, files[1].path, files[2].path);
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
