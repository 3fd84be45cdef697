// The rank/world/rendezvous variables of torchrun-style launchers, OpenMPI and Slurm, and the errors for
// malformed ones.
#include "distributed/process_group_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "core/error.h"

namespace mt {
namespace {

const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                       "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
                       "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                       "SLURM_JOB_ID", "SLURM_STEP_ID", "MIXTUNE_RENDEZVOUS_FD"};

// Sets exactly `vars` among kVars for the scope; restores the previous environment after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& vars) {
  ScopedEnv env(vars);
  try {
    process_group_env_from_environment();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ProcessGroupEnv, NoVariablesIsOneProcess) {
  ScopedEnv env({});
  const ProcessGroupEnv e = process_group_env_from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_FALSE(e.master_addr_given);
  EXPECT_FALSE(e.master_port_given);
  EXPECT_EQ(e.from, RankSource::single);
}

TEST(ProcessGroupEnv, TorchrunStyle) {
  ScopedEnv env({{"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "10.0.0.7"},
                 {"MASTER_PORT", "23456"}});
  const ProcessGroupEnv e = process_group_env_from_environment();
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 4);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 23456);
  EXPECT_EQ(e.rendezvous_fd, -1);
  EXPECT_TRUE(e.master_addr_given);
  EXPECT_TRUE(e.master_port_given);
  EXPECT_EQ(e.from, RankSource::torchrun);
}

TEST(ProcessGroupEnv, LaunchHandsRankZeroItsListener) {
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MIXTUNE_RENDEZVOUS_FD", "7"}});
    EXPECT_EQ(process_group_env_from_environment().rendezvous_fd, 7);
  }
  {  // only rank 0 listens
    ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MIXTUNE_RENDEZVOUS_FD", "7"}});
    EXPECT_EQ(process_group_env_from_environment().rendezvous_fd, -1);
  }
}

TEST(ProcessGroupEnv, OpenMpiAndSlurm) {
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.rank, 3);
    EXPECT_EQ(e.world, 4);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.local_world, 2);
    EXPECT_NE(e.source.find("OpenMPI"), std::string::npos);
    EXPECT_EQ(e.from, RankSource::open_mpi);  // distributed/mpi_bootstrap.h may bootstrap it
    EXPECT_FALSE(e.master_addr_given);
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "6"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_LOCALID", "2"},
                   {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"}, {"SLURM_NODEID", "0"}, {"SLURM_NTASKS", "32"}});
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.rank, 6);
    EXPECT_EQ(e.world, 16);  // the step's tasks, not the allocation's
    EXPECT_EQ(e.local_rank, 2);
    EXPECT_EQ(e.local_world, 8);
    EXPECT_EQ(e.from, RankSource::slurm);
  }
  {  // uneven nodes: this node's own count
    ScopedEnv env({{"SLURM_PROCID", "4"}, {"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_LOCALID", "0"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_NODEID", "2"}});
    EXPECT_EQ(process_group_env_from_environment().local_world, 1);
  }
  {  // a batch script or salloc shell: SLURM_PROCID and the allocation's SLURM_NTASKS, no step: one process
    ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "9"},
                   {"SLURM_JOB_NODELIST", "node[1-4]"}});
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.world, 1);
    EXPECT_EQ(e.from, RankSource::single);
    EXPECT_EQ(e.master_addr, "127.0.0.1");
  }
  {  // torchrun-style variables win over Slurm's (torchrun inside an allocation)
    ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
    EXPECT_EQ(process_group_env_from_environment().world, 2);
  }
}

// srun without MASTER_ADDR / MASTER_PORT: rank 0's host is the step's first node, the port comes from the job.
TEST(ProcessGroupEnv, SlurmRendezvousFromTheNodeListAndJobId) {
  const std::map<std::string, std::string> ranks = {{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "8"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(ranks.begin(), ranks.end());
    return extra;
  };
  {
    ScopedEnv env(with({{"SLURM_STEP_NODELIST", "gpu-[007-010,012],cpu3"},
                        {"SLURM_JOB_NODELIST", "other"},
                        {"SLURM_JOB_ID", "123456"},
                        {"SLURM_STEP_ID", "1"}}));
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.master_addr, "gpu-007");
    EXPECT_EQ(e.master_port, 20000 + 3456 * 4 + 1);
    EXPECT_NE(e.source.find("rendezvous on the first host of SLURM_STEP_NODELIST"), std::string::npos) << e.source;
  }
  {  // salloc's shell has only the job's list; no step id: step 0
    ScopedEnv env(with({{"SLURM_JOB_NODELIST", "node[3-4]"}, {"SLURM_JOB_ID", "77"}}));
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.master_addr, "node3");
    EXPECT_EQ(e.master_port, 20000 + 77 * 4);
  }
  {  // the user's MASTER_ADDR / MASTER_PORT win
    ScopedEnv env(with({{"SLURM_STEP_NODELIST", "node[3-4]"}, {"SLURM_JOB_ID", "77"}, {"MASTER_ADDR", "10.1.2.3"},
                        {"MASTER_PORT", "29999"}}));
    const ProcessGroupEnv e = process_group_env_from_environment();
    EXPECT_EQ(e.master_addr, "10.1.2.3");
    EXPECT_EQ(e.master_port, 29999);
  }
  {  // one task: nothing to meet
    ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_STEP_NODELIST", "node9"}});
    EXPECT_EQ(process_group_env_from_environment().master_addr, "127.0.0.1");
  }
  EXPECT_NE(error_of(with({{"SLURM_JOB_ID", "12x"}})).find("SLURM_JOB_ID='12x'"), std::string::npos);
  EXPECT_NE(error_of(with({{"SLURM_STEP_NODELIST", "node[1-2"}}))
                .find("SLURM_STEP_NODELIST='node[1-2' is not a Slurm host list"),
            std::string::npos);
}

TEST(ProcessGroupEnv, SlurmTasksOnNode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("8(x2)", 1, "V"), 8);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2, "V"), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3, "V"), 1);
  EXPECT_EQ(slurm_tasks_on_node("3,1(x2),5", 3, "V"), 5);
  for (const char* bad : {"", "x", "2(3)", "2(x)", "2(x3", "2(x3)4", "0", "2,,1", "-1"}) {
    try {
      slurm_tasks_on_node(bad, 0, "SLURM_STEP_TASKS_PER_NODE");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_TASKS_PER_NODE='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
  try {
    slurm_tasks_on_node("2(x2)", 2, "SLURM_STEP_TASKS_PER_NODE");
    ADD_FAILURE() << "node 2 of 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lists 2 nodes, SLURM_NODEID is 2"), std::string::npos) << e.what();
  }
}

TEST(ProcessGroupEnv, SlurmFirstHost) {
  EXPECT_EQ(slurm_first_host("node7", "L"), "node7");
  EXPECT_EQ(slurm_first_host("n[1-4]", "L"), "n1");
  EXPECT_EQ(slurm_first_host("n[09-12]", "L"), "n09");
  EXPECT_EQ(slurm_first_host("a[01-02]b[3,5]x,c[1-2]", "L"), "a01b3x");
  EXPECT_EQ(slurm_first_host("first,second", "L"), "first");
  for (const char* bad : {"", "n[", "n]1", "n[x-y]", "[]", ",a"}) {
    try {
      slurm_first_host(bad, "SLURM_NODELIST");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_NODELIST='" + std::string(bad) + "' is not a Slurm host list"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ProcessGroupEnv, BadValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "0"}, {"RANK", "0"}}).find("WORLD_SIZE=0 must be at least 1"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_ADDR", ""}}).find("MASTER_ADDR is empty"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2"),
            std::string::npos);
}

}  // namespace
}  // namespace mt
