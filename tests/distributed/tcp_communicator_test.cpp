// The CPU communicator with every rank a thread of this process, over loopback: collectives against a
// serial rank-order computation (bitwise), and the failure modes: a rank that never joins, a peer that
// goes away mid-collective, ranks that call different collectives, a collective that times out.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/tcp_socket.h"
#include "thread_ranks.h"

namespace mt {
namespace {

using std::chrono::milliseconds;

using test::env_of;
using test::free_port;
using test::run_ranks;

std::vector<float> values(int rank, int64_t n) {
  std::mt19937 g(1000 + rank);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g) * (rank + 1);
  return v;
}

TEST(TcpCommunicator, AllReduceIsTheRankOrderSumOnEveryRank) {
  for (const int world : {2, 3, 4}) {
    const int port = free_port();
    const int64_t sizes[] = {0, 1, 2, 5, 1000, 100003};
    std::vector<std::vector<std::vector<float>>> got(world);
    const auto err = run_ranks(world, [&](int r) {
      auto comm = tcp_communicator_create(env_of(r, world, port), milliseconds(20000));
      EXPECT_EQ(comm->rank(), r);
      EXPECT_EQ(comm->size(), world);
      for (const int64_t n : sizes) {
        std::vector<float> v = values(r, n);
        comm->all_reduce_sum(v.data(), n, "test all_reduce");
        got[r].push_back(v);
      }
    });
    for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "world " << world << " rank " << r;
    for (size_t c = 0; c < std::size(sizes); ++c) {
      const int64_t n = sizes[c];
      std::vector<float> want = values(0, n);
      for (int r = 1; r < world; ++r) {
        const std::vector<float> v = values(r, n);
        for (int64_t i = 0; i < n; ++i) want[i] += v[i];
      }
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(got[r][c][i], want[i]) << "world " << world << " rank " << r << " n " << n << " element " << i;
    }
  }
}

// reduce_sum: the root gets bitwise the all-reduce's rank-order sum, the others keep their values; sizes past
// one piece (4 Mi elements) and the empty one, every root.
TEST(TcpCommunicator, ReduceGivesTheRootTheRankOrderSum) {
  for (const int world : {2, 3}) {
    const int port = free_port();
    const int64_t sizes[] = {0, 1, 1000, (int64_t{1} << 22) + 3};
    std::vector<std::vector<std::vector<float>>> got(world);
    const auto err = run_ranks(world, [&](int r) {
      auto comm = tcp_communicator_create(env_of(r, world, port), milliseconds(20000));
      for (int root = 0; root < world; ++root)
        for (const int64_t n : sizes) {
          std::vector<float> v = values(r, n);
          comm->reduce_sum(v.data(), n, root, "test reduce");
          got[r].push_back(std::move(v));
        }
    });
    for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "world " << world << " rank " << r;
    size_t c = 0;
    for (int root = 0; root < world; ++root)
      for (const int64_t n : sizes) {
        std::vector<float> want = values(0, n);
        for (int r = 1; r < world; ++r) {
          const std::vector<float> v = values(r, n);
          for (int64_t i = 0; i < n; ++i) want[i] += v[i];
        }
        for (int r = 0; r < world; ++r) {
          const std::vector<float> expect = r == root ? want : values(r, n);
          ASSERT_EQ(got[r][c].size(), expect.size());
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(got[r][c][i], expect[i]) << "world " << world << " root " << root << " rank " << r << " n " << n
                                               << " element " << i;
        }
        ++c;
      }
  }
}

// all_reduce_sum within groups (the expert-parallel replicas {0, 2}, {1, 3} of four ranks; then a group of three
// listed out of rank order, the summation order being the list's): each member gets bitwise the list-order sum
// of the members' values, the other ranks keep theirs; world collectives still line up after group ones.
TEST(TcpCommunicator, GroupAllReduceIsTheListOrderSumOnEveryMember) {
  const int world = 4, port = free_port();
  const std::vector<std::vector<int>> groups = {{0, 2}, {1, 3}};
  const std::vector<int> three = {3, 0, 1};
  const int64_t sizes[] = {0, 1, 7, 100003};
  std::vector<std::vector<std::vector<float>>> got(world);
  std::vector<std::vector<double>> doubles(world);
  std::vector<float> after(world);
  const auto err = run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, world, port), milliseconds(20000));
    for (const int64_t n : sizes) {
      std::vector<float> v = values(r, n);
      comm->all_reduce_sum(groups[r % 2], v.data(), n, "test group all_reduce");
      got[r].push_back(std::move(v));
    }
    std::vector<double> d = {0.1 * (r + 1), 1e300 * (r == 3)};
    if (r != 2) comm->all_reduce_sum(three, d.data(), 2, "test group of three");
    doubles[r] = d;
    float one = 1.0f;
    comm->all_reduce_sum(&one, 1, "test world all_reduce after groups");
    after[r] = one;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  for (size_t c = 0; c < std::size(sizes); ++c) {
    const int64_t n = sizes[c];
    for (int r = 0; r < world; ++r) {
      const std::vector<int>& g = groups[r % 2];
      std::vector<float> want = values(g[0], n);
      const std::vector<float> v = values(g[1], n);
      for (int64_t i = 0; i < n; ++i) want[i] += v[i];
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[r][c][i], want[i]) << "rank " << r << " n " << n << " element " << i;
    }
  }
  const double list_order = (0.1 * 4 + 0.1 * 1) + 0.1 * 2;  // ranks 3, 0, 1
  for (int r : three) {
    EXPECT_EQ(doubles[r][0], list_order) << "rank " << r;
    EXPECT_EQ(doubles[r][1], 1e300) << "rank " << r;
  }
  EXPECT_EQ(doubles[2][0], 0.1 * 3);
  for (int r = 0; r < world; ++r) EXPECT_EQ(after[r], 4.0f);
  // A rank outside the group it is asked to reduce over is an error naming the collective.
  const int port2 = free_port();
  const auto bad = run_ranks(1, [&](int) {
    auto comm = tcp_communicator_create(env_of(0, 1, port2), milliseconds(2000));
    float x = 0;
    comm->all_reduce_sum(std::vector<int>{1}, &x, 1, "expert gradients, step 1");
  });
  EXPECT_NE(bad[0].find("all_reduce(expert gradients, step 1): rank 1 of the group is outside the world of 1"),
            std::string::npos)
      << bad[0];
}

// reduce_sum and broadcast within groups (the replicas {0, 2}, {1, 3} of four ranks, every member as root, sizes past
// one reduce piece; then the group {3, 0, 1} listed out of rank order): the root gets bitwise what the group's
// all-reduce gives (the list-order sum), the other members keep their values; a broadcast reaches the members
// only; world collectives still line up after them. A root outside the group is an error naming the collective.
TEST(TcpCommunicator, GroupReduceAndBroadcastStayWithinTheGroup) {
  const int world = 4, port = free_port();
  const std::vector<std::vector<int>> groups = {{0, 2}, {1, 3}};
  const std::vector<int> three = {3, 0, 1};
  const int64_t sizes[] = {0, 5, (int64_t{1} << 22) + 3};
  std::vector<std::vector<std::vector<float>>> reduced(world), all_reduced(world);
  std::vector<std::vector<int>> cast(world);
  std::vector<std::vector<float>> three_reduced(world), three_all_reduced(world);
  std::vector<float> after(world);
  const auto err = run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, world, port), milliseconds(20000));
    const std::vector<int>& g = groups[r % 2];
    for (const int root : g)
      for (const int64_t n : sizes) {
        std::vector<float> v = values(r, n), w = values(r, n);
        comm->reduce_sum(g, v.data(), n, root, "test group reduce");
        comm->all_reduce_sum(g, w.data(), n, "test group all_reduce");
        reduced[r].push_back(std::move(v));
        all_reduced[r].push_back(std::move(w));
        int b[3] = {100 * r, 100 * r + 1, 100 * r + 2};
        comm->broadcast(g, b, sizeof(b), root, "test group broadcast");
        cast[r].insert(cast[r].end(), b, b + 3);
      }
    if (r != 2) {
      std::vector<float> v = values(r, 1001), w = values(r, 1001);
      comm->reduce_sum(three, v.data(), 1001, 0, "test reduce over three");
      comm->all_reduce_sum(three, w.data(), 1001, "test all_reduce over three");
      three_reduced[r] = v, three_all_reduced[r] = w;
    }
    float one = 1.0f;
    comm->all_reduce_sum(&one, 1, "test world all_reduce after group reduces");
    after[r] = one;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  for (int r = 0; r < world; ++r) {
    const std::vector<int>& g = groups[r % 2];
    size_t c = 0;
    for (const int root : g)
      for (const int64_t n : sizes) {
        SCOPED_TRACE("rank " + std::to_string(r) + " root " + std::to_string(root) + " n " + std::to_string(n));
        const std::vector<float>& got = reduced[r][c];
        const std::vector<float> want = r == root ? all_reduced[r][c] : values(r, n);
        ASSERT_EQ(got.size(), want.size());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
        if (r == root && n > 0) {
          EXPECT_NE(got[0], values(r, n)[0]) << "the root's values were summed";
        }
        for (int k = 0; k < 3; ++k) EXPECT_EQ(cast[r][3 * c + k], 100 * root + k);
        ++c;
      }
  }
  for (int r : three) {
    const std::vector<float> want = r == 0 ? three_all_reduced[r] : values(r, 1001);  // root: rank 0
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(three_reduced[r][i], want[i]) << "rank " << r << " element " << i;
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(after[r], 4.0f);
  const int port2 = free_port();
  const auto bad = run_ranks(2, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, 2, port2), milliseconds(2000));
    float x = 0;
    comm->reduce_sum(std::vector<int>{r}, &x, 1, 1 - r, "expert gradients to their owner, step 1");
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(bad[r].find("reduce(expert gradients to their owner, step 1): root " + std::to_string(1 - r) +
                          " is not in the group"),
              std::string::npos)
        << bad[r];
}

TEST(TcpCommunicator, DoublesBroadcastAndBarrier) {
  const int world = 3, port = free_port();
  std::vector<std::vector<double>> sums(world);
  std::vector<std::string> text(world);
  const auto err = run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, world, port), milliseconds(20000));
    std::vector<double> v = {1.0 * r, 0.1, 1e300 * (r == 1)};
    comm->all_reduce_sum(v.data(), 3, "doubles");
    sums[r] = v;
    char buf[16] = {};
    if (r == 2) std::snprintf(buf, sizeof(buf), "from rank two");
    comm->broadcast(buf, sizeof(buf), 2, "broadcast");
    text[r] = buf;
    comm->barrier("barrier");
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(err[r], "");
    EXPECT_EQ(sums[r][0], 3.0);
    EXPECT_EQ(sums[r][1], (0.1 + 0.1) + 0.1);
    EXPECT_EQ(sums[r][2], 1e300);
    EXPECT_EQ(text[r], "from rank two");
  }
}

TEST(TcpCommunicator, MissingRankTimesOutNamingIt) {
  const int port = free_port();
  const auto err = run_ranks(1, [&](int) { tcp_communicator_create(env_of(0, 3, port), milliseconds(300)); });
  EXPECT_NE(err[0].find("1 of 3 ranks joined (missing: 1, 2)"), std::string::npos) << err[0];
}

TEST(TcpCommunicator, PeerThatGoesAwayIsAnError) {
  const int port = free_port();
  const auto err = run_ranks(2, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, 2, port), milliseconds(20000));
    if (r == 1) return;  // closes its connections without joining the collective
    std::vector<float> v(10, 1.0f);
    comm->all_reduce_sum(v.data(), 10, "all_reduce(gradients, step 3)");
  });
  EXPECT_NE(err[0].find("rank 0, peer rank 1, all_reduce(gradients, step 3): the peer closed the connection"),
            std::string::npos)
      << err[0];
  EXPECT_EQ(err[1], "");
}

TEST(TcpCommunicator, DifferentCollectivesAreAnError) {
  const int port = free_port();
  const auto err = run_ranks(2, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, 2, port), milliseconds(5000));
    if (r == 0) {
      std::vector<float> v(10, 1.0f);
      comm->all_reduce_sum(v.data(), 10, "all_reduce(x)");
    } else {
      comm->barrier("barrier(y)");
    }
  });
  EXPECT_NE(err[0].find("collective mismatch"), std::string::npos) << err[0];
  EXPECT_NE(err[1].find("collective mismatch"), std::string::npos) << err[1];
}

TEST(TcpCommunicator, CollectiveTimesOutNamingTheWaitedRank) {
  const int port = free_port();
  std::atomic<bool> done{false};
  const auto err = run_ranks(2, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, 2, port), milliseconds(400));
    if (r == 1) {  // alive but never joins the collective
      while (!done) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    try {
      comm->barrier("barrier(checkpoint)");
    } catch (...) {
      done = true;
      throw;
    }
    done = true;
  });
  EXPECT_NE(err[0].find("rank 0: barrier(checkpoint) did not complete within 0.4 s (waiting for rank 1)"),
            std::string::npos)
      << err[0];
}

}  // namespace
}  // namespace mt
