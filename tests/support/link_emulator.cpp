// A network between network namespaces with delay, jitter, loss, a bandwidth cap, reordering
// and partitions, in user space: for kernels without sch_netem (tc's netem qdisc), where
// tests still need a link that behaves like a user's. Each host namespace has a TUN device
// (made by the caller, `ip tuntap add dev eth0 mode tun`, with its address and up); this
// program attaches to every host's device and is the router between them: it reads each IPv4
// packet a host sends, finds the host of its destination address, and writes it into that
// host's device after what the link's impairment says, or drops it. Nothing else joins the
// namespaces, so a host reaches the others and nothing more.
//
// The impairment is netem's, in netem's words (tests/support/link_impairment.hpp: delay and
// jitter, independent or Gilbert-Elliott loss, a rate, reordering, a queue limit), applied once
// to each packet as it leaves its host (as netem on every host's eth0): a round trip crosses
// it twice.
//
// Usage:
//   link_emulator --host NETNS=ADDR [--host NETNS=ADDR ...] [--dev eth0] [--seed N]
//                 [--control FIFO] [SPEC...]
// NETNS is a name under /run/netns (ip netns) or a path to a namespace. Prints "ready" once
// it serves every host. FIFO (made by the caller) takes a command a line:
//   set SPEC...   every link's impairment from now on ("set" alone: none)
//   cut I / plug I   host I (from 0, in --host order) partitioned from every other, or back
//   stats         prints "stats: forwarded=... lost=... ..." (the counts so far)
// and prints "done N: COMMAND" once the Nth command took effect (a bad one is not counted).
// On SIGTERM or SIGINT it prints its stats and exits 0. Needs CAP_NET_ADMIN and CAP_SYS_ADMIN
// (setns); a bad argument or command is one line on stderr naming it (exit 2, or ignored for
// a command).
#include <support/link_impairment.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <queue>
#include <string>
#include <vector>

namespace {

using loom::testing::netem::nanoseconds;
namespace netem = loom::testing::netem;

nanoseconds now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return nanoseconds{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

struct counters {
  std::uint64_t forwarded = 0, lost = 0, partitioned = 0, queue_full = 0, unroutable = 0,
                write_failed = 0, bytes = 0;
};

// A host: its TUN device's descriptor and address, and the link of the packets it sends.
struct host {
  std::string netns;
  std::uint32_t address = 0; // network order
  int fd = -1;
  bool cut = false;
  std::optional<netem::link> out;
};

struct scheduled {
  nanoseconds at;
  std::uint64_t order; // ties in arrival order
  std::size_t from, to;
  mutable std::vector<std::uint8_t> packet; // moved back to the pool once written
  bool operator>(const scheduled& o) const { return at != o.at ? at > o.at : order > o.order; }
};

class emulator {
public:
  emulator(std::vector<host> hosts, netem::impairment m, std::uint64_t seed)
      : hosts_(std::move(hosts)), m_(m) {
    for (std::size_t i = 0; i < hosts_.size(); ++i)
      hosts_[i].out.emplace(seed + i);
  }

  void set(const netem::impairment& m) { m_ = m; }
  void cut(std::size_t i, bool cut) { hosts_.at(i).cut = cut; }
  std::size_t size() const { return hosts_.size(); }
  const std::vector<host>& hosts() const { return hosts_; }

  std::string stats() const {
    char line[256];
    std::snprintf(line, sizeof line,
                  "stats: forwarded=%llu lost=%llu partitioned=%llu queue_full=%llu "
                  "unroutable=%llu write_failed=%llu bytes=%llu",
                  static_cast<unsigned long long>(c_.forwarded),
                  static_cast<unsigned long long>(c_.lost),
                  static_cast<unsigned long long>(c_.partitioned),
                  static_cast<unsigned long long>(c_.queue_full),
                  static_cast<unsigned long long>(c_.unroutable),
                  static_cast<unsigned long long>(c_.write_failed),
                  static_cast<unsigned long long>(c_.bytes));
    return line;
  }

  // Reads what host i sent (at most a batch, so that no host starves the others).
  void read_from(std::size_t i) {
    for (int n = 0; n < 64; ++n) {
      const ssize_t got = ::read(hosts_[i].fd, buffer_.data(), buffer_.size());
      if (got <= 0)
        return; // EAGAIN: all read
      std::vector<std::uint8_t> packet = fresh_packet();
      packet.assign(buffer_.begin(), buffer_.begin() + got);
      take(i, std::move(packet));
    }
  }

  // Writes every packet due by now; the nanoseconds until the next is due (-1: none).
  nanoseconds deliver_due() {
    const nanoseconds now = now_ns();
    while (!queue_.empty() && queue_.top().at <= now) {
      const scheduled& s = queue_.top();
      host& from = hosts_[s.from];
      from.out->delivered();
      if (from.cut || hosts_[s.to].cut) {
        ++c_.partitioned; // cut while on the wire
      } else if (::write(hosts_[s.to].fd, s.packet.data(), s.packet.size()) !=
                 static_cast<ssize_t>(s.packet.size())) {
        ++c_.write_failed;
      } else {
        ++c_.forwarded;
        c_.bytes += s.packet.size();
      }
      recycle(std::move(s.packet));
      queue_.pop();
    }
    return queue_.empty() ? -1 : queue_.top().at - now;
  }

private:
  // Packets' buffers are reused (one read buffer of the largest size, each packet copied out
  // at its own size into a buffer a delivered one left): no allocation per packet once the
  // links hold as many as they will.
  std::vector<std::uint8_t> fresh_packet() {
    if (pool_.empty())
      return {};
    std::vector<std::uint8_t> p = std::move(pool_.back());
    pool_.pop_back();
    return p;
  }
  void recycle(std::vector<std::uint8_t> p) { pool_.push_back(std::move(p)); }

  void take(std::size_t from, std::vector<std::uint8_t> packet) {
    // IPv4 only (the hosts have IPv4 addresses; IPv6's own chatter goes nowhere).
    if (packet.size() < 20 || (packet[0] >> 4) != 4) {
      ++c_.unroutable;
      return recycle(std::move(packet));
    }
    std::uint32_t destination;
    std::memcpy(&destination, packet.data() + 16, 4);
    std::size_t to = hosts_.size();
    for (std::size_t j = 0; j < hosts_.size(); ++j)
      if (hosts_[j].address == destination)
        to = j;
    if (to == hosts_.size() || to == from) {
      ++c_.unroutable;
      return recycle(std::move(packet));
    }
    if (hosts_[from].cut || hosts_[to].cut) {
      ++c_.partitioned;
      return recycle(std::move(packet));
    }
    const netem::fate f = hosts_[from].out->send(m_, packet.size(), now_ns());
    if (f.lost || f.queue_full) {
      ++(f.lost ? c_.lost : c_.queue_full);
      return recycle(std::move(packet));
    }
    queue_.push({f.at, order_++, from, to, std::move(packet)});
  }

  std::vector<host> hosts_;
  std::vector<std::uint8_t> buffer_ = std::vector<std::uint8_t>(65536); // a packet read
  std::vector<std::vector<std::uint8_t>> pool_; // delivered or dropped packets' buffers
  netem::impairment m_;
  counters c_;
  std::uint64_t order_ = 0;
  std::priority_queue<scheduled, std::vector<scheduled>, std::greater<>> queue_;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "link_emulator: %s\n", what.c_str());
  std::exit(2);
}

// Attaches to the TUN device `dev` of namespace `netns`; this thread goes back to its own
// namespace after (a descriptor keeps the namespace it was opened in).
int attach(const std::string& netns, const std::string& dev, int home) {
  const std::string path = netns.find('/') == std::string::npos ? "/run/netns/" + netns : netns;
  const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0)
    fail("cannot open the network namespace " + path + ": " + std::strerror(errno));
  if (::setns(ns, CLONE_NEWNET) != 0)
    fail("cannot enter the network namespace " + path + ": " + std::strerror(errno));
  ::close(ns);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    fail(std::string("cannot open /dev/net/tun: ") + std::strerror(errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  if (dev.size() >= IFNAMSIZ)
    fail("--dev " + dev + ": longer than an interface name can be");
  std::memcpy(ifr.ifr_name, dev.c_str(), dev.size());
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0)
    fail("cannot attach to " + dev + " in " + path + " (a TUN device, `ip tuntap add dev " + dev +
         " mode tun`): " + std::strerror(errno));
  if (::setns(home, CLONE_NEWNET) != 0)
    fail(std::string("cannot return to this process's network namespace: ") + std::strerror(errno));
  return fd;
}

volatile std::sig_atomic_t stopping = 0;
void on_stop(int) {
  stopping = 1;
}

// One command from the control FIFO; "done N: <command>" once it took effect, N counting the
// commands from 1 (so that a caller can wait for its Nth).
void command(emulator& e, const std::string& line, std::uint64_t& done) {
  const auto words = netem::words_of(line);
  if (words.empty())
    return;
  try {
    if (words[0] == "set") {
      e.set(netem::parse({words.begin() + 1, words.end()}));
    } else if ((words[0] == "cut" || words[0] == "plug") && words.size() == 2) {
      const long i = std::strtol(words[1].c_str(), nullptr, 10);
      if (i < 0 || static_cast<std::size_t>(i) >= e.size() ||
          words[1].find_first_not_of("0123456789") != std::string::npos)
        throw netem::bad_impairment("host '" + words[1] + "' is not one of 0.." +
                                    std::to_string(e.size() - 1));
      e.cut(static_cast<std::size_t>(i), words[0] == "cut");
    } else if (words[0] == "stats") {
      std::printf("%s\n", e.stats().c_str());
    } else {
      throw netem::bad_impairment("'" + words[0] + "' is not set, cut I, plug I or stats");
    }
    std::printf("done %llu: %s\n", static_cast<unsigned long long>(++done), line.c_str());
  } catch (const netem::bad_impairment& b) {
    std::fprintf(stderr, "link_emulator: command '%s': %s\n", line.c_str(), b.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
}

} // namespace

int main(int argc, char** argv) {
  std::vector<host> hosts;
  std::string dev = "eth0", control;
  std::uint64_t seed = 1;
  std::vector<std::string> spec;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        fail(a + ": a value is missing");
      return argv[++i];
    };
    if (a == "--host") {
      const std::string v = value();
      const auto eq = v.find('=');
      host h;
      h.netns = v.substr(0, eq);
      if (eq == std::string::npos || h.netns.empty() ||
          ::inet_pton(AF_INET, v.substr(eq + 1).c_str(), &h.address) != 1)
        fail("--host " + v + ": not NETNS=IPV4ADDRESS");
      hosts.push_back(h);
    } else if (a == "--dev") {
      dev = value();
    } else if (a == "--control") {
      control = value();
    } else if (a == "--seed") {
      seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a.rfind("--", 0) == 0) {
      fail(a + ": not an option (--host, --dev, --seed, --control)");
    } else {
      spec.push_back(a);
    }
  }
  if (hosts.size() < 2)
    fail("give at least two --host NETNS=ADDR");
  netem::impairment m;
  try {
    m = netem::parse(spec);
  } catch (const netem::bad_impairment& b) {
    fail(b.what());
  }
  const int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0)
    fail(std::string("cannot open /proc/self/ns/net: ") + std::strerror(errno));
  for (host& h : hosts)
    h.fd = attach(h.netns, dev, home);
  int control_fd = -1;
  if (!control.empty()) {
    // Read and write, so that the FIFO never reads as ended between two writers.
    control_fd = ::open(control.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (control_fd < 0)
      fail("--control " + control + ": " + std::strerror(errno));
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  emulator e(std::move(hosts), m, seed);
  std::printf("link_emulator: routing %zu hosts' %s; ready\n", e.size(), dev.c_str());
  std::fflush(stdout);

  std::vector<pollfd> fds;
  for (const host& h : e.hosts())
    fds.push_back({h.fd, POLLIN, 0});
  if (control_fd >= 0)
    fds.push_back({control_fd, POLLIN, 0});
  std::string pending; // the control FIFO's unfinished line
  std::uint64_t commands_done = 0;
  while (!stopping) {
    const nanoseconds wait = e.deliver_due();
    timespec timeout{};
    if (wait >= 0) {
      timeout.tv_sec = wait / 1'000'000'000;
      timeout.tv_nsec = wait % 1'000'000'000;
    }
    const int ready = ::ppoll(fds.data(), fds.size(), wait >= 0 ? &timeout : nullptr, nullptr);
    if (ready < 0) {
      if (errno == EINTR)
        continue;
      fail(std::string("poll: ") + std::strerror(errno));
    }
    for (std::size_t i = 0; i < e.size(); ++i)
      if (fds[i].revents & POLLIN)
        e.read_from(i);
      else if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL))
        fail("host " + std::to_string(i) + "'s device failed (was it deleted?)");
    if (control_fd >= 0 && (fds.back().revents & POLLIN)) {
      char buffer[4096];
      const ssize_t got = ::read(control_fd, buffer, sizeof buffer);
      if (got > 0)
        pending.append(buffer, static_cast<std::size_t>(got));
      for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
        command(e, pending.substr(0, nl), commands_done);
        pending.erase(0, nl + 1);
      }
    }
  }
  std::printf("%s\n", e.stats().c_str());
  return 0;
}
