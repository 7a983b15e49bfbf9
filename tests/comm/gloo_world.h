// A gloo group whose ranks are threads of the test process, rendezvousing
// through a TcpStore on a free loopback port.
#ifndef SHARDKIT_TESTS_COMM_GLOO_WORLD_H_
#define SHARDKIT_TESTS_COMM_GLOO_WORLD_H_

#include <memory>
#include <vector>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/store.h"
#include "tests/comm/comm_test_util.h"

namespace sk::comm::testing {

struct GlooWorld {
  explicit GlooWorld(int world, GlooOptions options = {}) : groups(world) {
    auto s = TcpStore::Create("127.0.0.1", 0, /*serve=*/true, std::chrono::seconds(10));
    CHECK(s.ok()) << s.status();
    server = std::move(s).value();
    RunRanks(world, [&](int r) {
      auto client = TcpStore::Create("127.0.0.1", server->port(), false, std::chrono::seconds(10));
      CHECK(client.ok()) << client.status();
      auto g = GlooProcessGroup::Create(std::shared_ptr<Store>(std::move(client).value()), "test",
                                        r, world, options);
      CHECK(g.ok()) << g.status();
      groups[r] = std::move(g).value();
    });
  }
  // Every rank's destructor runs a final barrier with the others: in parallel.
  ~GlooWorld() {
    RunRanks(static_cast<int>(groups.size()), [&](int r) { groups[r].reset(); });
  }
  std::unique_ptr<TcpStore> server;
  std::vector<std::unique_ptr<ProcessGroup>> groups;
};

}  // namespace sk::comm::testing

#endif  // SHARDKIT_TESTS_COMM_GLOO_WORLD_H_
