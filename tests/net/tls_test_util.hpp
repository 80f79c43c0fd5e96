// Helpers of the TLS tests: certificates made for the test run (a CA, certificates it signs,
// and a stranger's CA; OpenSSL's API, EC P-256 keys, valid for a day), so no key or
// certificate is committed or expires; and a TCP relay that records the bytes crossing it.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sys/socket.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace loom::net::testing {

// A private key and its certificate, written as PEM files.
struct pem_pair {
  std::string cert, key;
};

// Makes certificates in a fresh directory (removed with it).
class test_pki {
public:
  test_pki() {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_tls_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(dir_);
  }
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;
  ~test_pki() {
    for (auto& [k, x] : issued_) {
      EVP_PKEY_free(k);
      X509_free(x);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A self-signed CA named `name`: its certificate and key.
  pem_pair ca(const std::string& name) { return issue(name, nullptr, true); }
  // A certificate for `name` signed by the CA `issuer` (a pair this object made).
  pem_pair leaf(const std::string& name, const pem_pair& issuer) {
    return issue(name, &issuer, false);
  }
  // A file holding `text` (a bad certificate, say).
  std::string file(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return p;
  }

private:
  static int& counter() {
    static int n = 0;
    return n;
  }

  pem_pair issue(const std::string& name, const pem_pair* issuer, bool is_ca) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = X509_new();
    if (!key || !x)
      throw std::runtime_error("OpenSSL could not make a key or a certificate");
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(issued_.size() + 1));
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
    X509* signer = x;
    EVP_PKEY* signer_key = key;
    if (issuer) {
      for (auto& [k, c] : issued_)
        if (paths_[c].cert == issuer->cert) {
          signer = c;
          signer_key = k;
        }
      if (signer == x)
        throw std::runtime_error("unknown issuer " + issuer->cert);
    }
    X509_set_issuer_name(x, X509_get_subject_name(signer));
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, x, nullptr, nullptr, 0);
    const auto add = [&](int nid, const char* value) {
      X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      if (!e)
        throw std::runtime_error("OpenSSL could not make a certificate extension");
      X509_add_ext(x, e, -1);
      X509_EXTENSION_free(e);
    };
    add(NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "CA:FALSE");
    add(NID_key_usage, is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
    add(NID_subject_key_identifier, "hash");
    if (X509_sign(x, signer_key, EVP_sha256()) == 0)
      throw std::runtime_error("OpenSSL could not sign a certificate");
    pem_pair out{(dir_ / (name + ".pem")).string(), (dir_ / (name + ".key")).string()};
    std::FILE* f = std::fopen(out.cert.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(out.key.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    issued_.emplace_back(key, x);
    paths_[x] = out;
    return out;
  }

  std::filesystem::path dir_;
  std::vector<std::pair<EVP_PKEY*, X509*>> issued_;
  std::map<X509*, pem_pair> paths_;
};

// Listens on 127.0.0.1 (port chosen by the OS) and relays every connection to
// 127.0.0.1:target, keeping a copy of every byte that crosses it in either direction.
class tcp_relay {
public:
  using tcp = asio::ip::tcp;

  explicit tcp_relay(std::uint16_t target)
      : target_(target), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    accepting_ = std::thread([this] { accept_loop(); });
  }
  tcp_relay(const tcp_relay&) = delete;
  tcp_relay& operator=(const tcp_relay&) = delete;
  ~tcp_relay() {
    stopping_ = true;
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR); // wakes accept()
    {
      std::lock_guard lk(m_);
      for (auto& s : sockets_)
        ::shutdown(s->native_handle(), SHUT_RDWR); // wakes the pumps' reads
    }
    accepting_.join();
    for (auto& t : pumps_)
      t.join();
  }

  std::uint16_t port() const noexcept { return port_; }

  // Every byte relayed so far, both directions, in arrival order per chunk.
  std::string seen() {
    std::lock_guard lk(m_);
    return seen_;
  }

private:
  void accept_loop() {
    for (;;) {
      auto from = std::make_shared<tcp::socket>(io_);
      std::error_code ec;
      acceptor_.accept(*from, ec);
      if (ec || stopping_)
        return;
      auto to = std::make_shared<tcp::socket>(io_);
      to->connect({asio::ip::make_address("127.0.0.1"), target_}, ec);
      if (ec)
        continue;
      std::lock_guard lk(m_);
      sockets_.push_back(from);
      sockets_.push_back(to);
      pumps_.emplace_back([this, from, to] { pump(*from, *to); });
      pumps_.emplace_back([this, from, to] { pump(*to, *from); });
    }
  }

  void pump(tcp::socket& in, tcp::socket& out) {
    std::vector<char> buf(64 << 10);
    for (;;) {
      std::error_code ec;
      const std::size_t n = in.read_some(asio::buffer(buf), ec);
      if (ec)
        break;
      {
        std::lock_guard lk(m_);
        seen_.append(buf.data(), n);
      }
      asio::write(out, asio::buffer(buf.data(), n), ec);
      if (ec)
        break;
    }
    ::shutdown(out.native_handle(), SHUT_WR);
    ::shutdown(in.native_handle(), SHUT_RD);
  }

  std::uint16_t target_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accepting_;
  std::mutex m_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<std::thread> pumps_; // started by accepting_ only, joined after it
  std::string seen_;
};

} // namespace loom::net::testing
