// The run's store (server and client, no training): c10d's semantics for every
// operation, waits that end in time, the token, and the faults that wedged LibTorch's
// TCPStore server: a client stopped halfway through a request must not delay anybody
// else, a silent or foreign connection is closed, and a store host that never answers
// makes a call fail within its limit instead of blocking.
#include "catch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "sana/distributed/store_client.h"
#include "sana/distributed/store_data.h"
#include "sana/distributed/store_server.h"

using namespace sana::dist;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kToken = "0123456789abcdef";

StoreServerOptions loopback_options() {
  StoreServerOptions o;
  o.bind_host = "127.0.0.1";
  o.port = 0;
  o.token = kToken;
  return o;
}

StoreClient::Bytes b(const std::string& s) { return {s.begin(), s.end()}; }
std::string s(const StoreClient::Bytes& v) { return {v.begin(), v.end()}; }

// A raw TCP connection to the server, for clients that misbehave.
int raw_connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// A loopback socket listening on a free port that nobody accepts on unless the test does.
int listen_loopback(int& port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(fd, 8) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

// Waits (bounded) until the server closes `fd`: true when it did.
bool closed_by_server(int fd, std::chrono::milliseconds limit) {
  timeval tv{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>((limit.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;       // closed (after its error reply, if any)
    if (n < 0) return false;       // timed out: still open
  }
}

template <class F>
double seconds_of(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("the run's store keeps c10d's semantics for every operation") {
  StoreServer server(loopback_options());
  StoreClient c("127.0.0.1", server.port(), kToken, 5s, 5s);
  c.set("a", b("1"));
  CHECK(s(c.get("a", 1s)) == "1");
  CHECK(c.check({"a"}));
  CHECK_FALSE(c.check({"a", "b"}));
  CHECK(c.add("n", 5) == 5);
  CHECK(c.add("n", -2) == 3);
  CHECK(s(c.get("n", 1s)) == "3");  // counters are decimal text, as c10d keeps them
  c.set("word", b("x"));
  CHECK_THROWS_WITH(c.add("word", 1), Catch::Contains("does not hold an integer"));
  // compare-set: a missing key is created only when `expected` is empty.
  CHECK(s(c.compare_set("cs", b("nope"), b("v"))) == "nope");
  CHECK_FALSE(c.check({"cs"}));
  CHECK(s(c.compare_set("cs", {}, b("v1"))) == "v1");
  CHECK(s(c.compare_set("cs", b("other"), b("v2"))) == "v1");
  CHECK(s(c.compare_set("cs", b("v1"), b("v2"))) == "v2");
  CHECK(c.num_keys() == 4);  // a, n, word, cs
  CHECK(c.erase("cs"));
  CHECK_FALSE(c.erase("cs"));
  CHECK(c.num_keys() == 3);
  const std::string big(3 << 20, 'z');  // a few MB in one value
  c.set("big", b(big));
  CHECK(s(c.get("big", 1s)) == big);
}

TEST_CASE("the store host tells how long ago a key was last written, whoever wrote it") {
  // What a new watcher of a rank's heartbeat asks (failure_watch.h): the host's own clock,
  // here a counter, so that the ages are exact.
  int64_t clock_ms = 1000;
  StoreData data([&] { return clock_ms; });
  using store_wire::FrameWriter;
  using store_wire::Op;
  const auto apply = [&](FrameWriter f) {
    const auto frame = f.take();
    return data.apply(frame.data() + 4, frame.size() - 4);
  };
  const auto age = [&](const std::string& key) {
    const auto o = apply(FrameWriter(static_cast<uint8_t>(Op::age)).field(key));
    REQUIRE(o.kind == StoreData::Outcome::Kind::reply);
    store_wire::FrameReader r(o.frame.data() + 4, o.frame.size() - 4);
    REQUIRE(r.head() == uint8_t{0});
    return r.integer().value_or(-99);
  };
  CHECK(age("hb/1") == -1);
  apply(FrameWriter(static_cast<uint8_t>(Op::set)).field("hb/1").field(b("1 0")));
  clock_ms += 2500;
  CHECK(age("hb/1") == 2500);
  apply(FrameWriter(static_cast<uint8_t>(Op::add)).field("n").integer(1));
  clock_ms += 40;
  CHECK(age("n") == 40);
  CHECK(age("hb/1") == 2540);
  apply(FrameWriter(static_cast<uint8_t>(Op::add)).field("n").integer(1));
  CHECK(age("n") == 0);
  // A compare-set that changes nothing leaves the age; one that changes the value resets it.
  clock_ms += 7;
  apply(FrameWriter(static_cast<uint8_t>(Op::compare_set)).field("hb/1").field(b("other")).field(b("x")));
  CHECK(age("hb/1") == 2547);
  apply(FrameWriter(static_cast<uint8_t>(Op::compare_set)).field("hb/1").field(b("1 0")).field(b("2 0")));
  CHECK(age("hb/1") == 0);
  apply(FrameWriter(static_cast<uint8_t>(Op::erase)).field("hb/1"));
  CHECK(age("hb/1") == -1);
  // A malformed request (an extra field) is refused, not answered.
  CHECK(apply(FrameWriter(static_cast<uint8_t>(Op::age)).field("n").field("extra")).kind ==
        StoreData::Outcome::Kind::malformed);

  // Through a connection: a key just written is young, a missing one has no age.
  StoreServer server(loopback_options());
  StoreClient c("127.0.0.1", server.port(), kToken, 5s, 5s);
  c.set("a", b("1"));
  const int64_t young = c.age_ms("a");
  CHECK(young >= 0);
  CHECK(young < 5000);
  CHECK(c.age_ms("missing") == -1);
}

TEST_CASE("a get waits for a key another client sets, a wait that runs out names the missing keys") {
  StoreServer server(loopback_options());
  StoreClient waiter("127.0.0.1", server.port(), kToken, 5s, 5s);
  StoreClient setter("127.0.0.1", server.port(), kToken, 5s, 5s);
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    setter.set("late", b("here"));
  });
  CHECK(s(waiter.get("late", 5s)) == "here");
  t.join();
  double took = 0;
  try {
    took = seconds_of([&] { waiter.wait({"late", "never"}, 300ms); });
    FAIL("the wait did not time out");
  } catch (const StoreTimeout& e) {
    CHECK(std::string(e.what()).find("'never'") != std::string::npos);
    CHECK(std::string(e.what()).find("'late'") == std::string::npos);
  }
  CHECK(took < 2.0);
  // The connection is still usable after a wait ran out.
  CHECK(s(waiter.get("late", 1s)) == "here");
}

TEST_CASE("a wrong token is refused and counted, it can neither read nor change a key") {
  StoreServer server(loopback_options());
  StoreClient good("127.0.0.1", server.port(), kToken, 5s, 5s);
  good.set("failed", b("nothing"));
  CHECK_THROWS_AS(StoreClient("127.0.0.1", server.port(), "not-the-token-at-all", 5s, 5s), StoreRefused);
  CHECK_THROWS_AS(StoreClient("127.0.0.1", server.port(), "", 5s, 5s), StoreRefused);
  CHECK(server.refused() == 2);
  REQUIRE_FALSE(server.refusals().empty());
  CHECK(server.refusals().front().find("wrong run token") != std::string::npos);
  CHECK(s(good.get("failed", 1s)) == "nothing");
}

TEST_CASE("a client stopped halfway through a request delays nobody else") {
  // LibTorch's TCPStore server read such a request to its end before serving anyone:
  // a rank stopped mid-request wedged the store for every rank.
  StoreServer server(loopback_options());
  const int raw = raw_connect(server.port());
  // Half a hello: a length that promises more bytes than ever come.
  const uint8_t half[] = {200, 0, 0, 0, 1, 12, 0};
  REQUIRE(send(raw, half, sizeof half, 0) == static_cast<ssize_t>(sizeof half));
  StoreClient other("127.0.0.1", server.port(), kToken, 5s, 5s);
  const double took = seconds_of([&] {
    for (int i = 0; i < 100; ++i) other.set("k" + std::to_string(i), b("v"));
    CHECK(other.check({"k99"}));
  });
  CHECK(took < 1.0);
  close(raw);
}

TEST_CASE("a connection that never says hello, or starts with a huge frame, is closed") {
  auto o = loopback_options();
  o.hello_limit = 300ms;
  StoreServer server(o);
  const int silent = raw_connect(server.port());
  CHECK(closed_by_server(silent, 3s));
  close(silent);
  const int huge = raw_connect(server.port());
  const uint8_t frame[] = {0xff, 0xff, 0xff, 0x7f, 1};
  REQUIRE(send(huge, frame, sizeof frame, 0) == static_cast<ssize_t>(sizeof frame));
  CHECK(closed_by_server(huge, 3s));
  close(huge);
  const int early = raw_connect(server.port());
  const uint8_t set_first[] = {1, 0, 0, 0, 2};  // a set before hello
  REQUIRE(send(early, set_first, sizeof set_first, 0) == static_cast<ssize_t>(sizeof set_first));
  CHECK(closed_by_server(early, 3s));
  close(early);
  CHECK(server.refused() == 3);
}

TEST_CASE("a store host that accepts and never answers: the call fails within its limit, later ones at once") {
  // A listening socket nobody serves: connections complete in the kernel's backlog.
  int port = 0;
  const int lfd = listen_loopback(port);
  double took = seconds_of([&] {
    CHECK_THROWS_AS(StoreClient("127.0.0.1", port, kToken, 500ms, 500ms), StoreTimeout);
  });
  CHECK(took < 3.0);
  close(lfd);
}

TEST_CASE("a store host that stops answering mid-run: the call times out, the connection is then lost") {
  // A fake store host: answers hello, then reads requests and never answers.
  int port = 0;
  const int lfd = listen_loopback(port);
  std::thread host([lfd] {
    const int fd = accept(lfd, nullptr, nullptr);
    uint8_t buf[4096];
    (void)!recv(fd, buf, sizeof buf, 0);  // the hello
    const uint8_t ok[] = {1, 0, 0, 0, 0};
    (void)!send(fd, ok, sizeof ok, 0);
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    close(fd);
  });
  {
    StoreClient c("127.0.0.1", port, kToken, 2s, 400ms);
    double took = 0;
    try {
      took = seconds_of([&] { c.set("hb/1", b("1")); });
      FAIL("the set returned");
    } catch (const StoreTimeout& e) {
      CHECK(std::string(e.what()).find("no answer from the store at 127.0.0.1:") != std::string::npos);
      CHECK(std::string(e.what()).find("'hb/1'") != std::string::npos);
    }
    CHECK(took < 2.0);
    const double then = seconds_of([&] { CHECK_THROWS_AS(c.check({"x"}), StoreLost); });
    CHECK(then < 0.1);
  }
  host.join();
  close(lfd);
}

TEST_CASE("the store listens on the master address's interface: loopback for a single-host run") {
  std::string note;
  CHECK(store_bind_host("127.0.0.1", &note) == "127.0.0.1");
  CHECK(note.empty());
  const std::string local = store_bind_host("localhost", &note);
  CHECK((local == "127.0.0.1" || local == "::1"));
  // An address that is none of this host's (the benchmarking range; nothing here has it).
  CHECK(store_bind_host("198.18.255.254", &note).empty());
  CHECK(note.find("not an address of this host") != std::string::npos);
  StoreServer server(loopback_options());
  CHECK(server.address().rfind("127.0.0.1:", 0) == 0);
}
