// Nothing written is lost: kill -9 at any instant leaves metrics.h5 readable with every
// flushed interval and the resumed run continues it; a reader opens metrics.h5 while the
// run writes it; a full disk (a small tmpfs in a private mount namespace: needs root, as
// CI has) is an error naming the file, exit 1 (no crash in HDF5's exit handlers), with the
// last checkpoint and the metrics intact; unfinished checkpoint files are removed at the
// next start, and nothing else is.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

std::string train(const fs::path& run, const fs::path& ckpt, const std::string& extra) {
  return mb::testing::bin_dir() + "/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "
         "--micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --log-interval 1 --eval-iters 0 --threads 1 --data-path " +
         (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " + run.string() + " --save " +
         ckpt.string() + " " + extra;
}

// h5py's view of a metrics file: "ok N" when it opens, every train/ series has N rows and
// train/iteration is 1..N; otherwise what is wrong. A run killed before its first interval
// was flushed leaves the file that its start wrote, the configuration and no train/ group:
// "ok 0" (on a loaded machine the first iteration can take longer than the first kills).
std::string check_metrics(const fs::path& metrics) {
  const auto r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np, sys\n"
      "f = h5py.File('" + metrics.string() + "', 'r')\n"
      "'config' in f.attrs or sys.exit('no config attribute: ' + str(list(f.attrs)))\n"
      "'train' in f or sys.exit(print('ok 0'))\n"
      "g = f['train']; n = len(g['iteration'])\n"
      "bad = [k for k in g if len(g[k]) != n]\n"
      "print('uneven', bad) if bad else print('ok', n) if np.array_equal(g['iteration'][:], np.arange(1, n + 1)) "
      "else print('iterations', g['iteration'][:])\" 2>&1");
  return r.output;
}

}  // namespace

// Kills at instants set by what the run has done, not by the clock: the run is a million
// iterations long by its configuration, so however fast the machine, every kill finds it
// running. Each kill waits for an event of this attempt (it started, printed its plan, logged
// k iterations) and then a few milliseconds more, so that the kills land at different points
// of an iteration (during a metrics flush, a checkpoint write, the step). Every attempt
// resumes from the checkpoint the last one left (one every 2 iterations).
TEST(Durability, KillNineAtAnyInstantLeavesMetricsReadableAndTheRunContinuesThem) {
  mb::testing::TempDir tmp;
  const fs::path run = tmp / "run", ckpt = tmp / "ckpt", log = tmp / "log";
  const std::string cmd = train(run, ckpt, "--train-iters 1000000 --save-interval 2 --load " + ckpt.string());
  auto logged = [&](const std::string& pattern, int count) {  // shell: wait until the log has `count` such lines
    return "until [ $(grep -c '" + pattern + "' " + log.string() + ") -ge " + std::to_string(count) +
           " ] || ! kill -0 $pid; do sleep 0.01; done; ";
  };
  const std::vector<std::string> waits = {
      "",                                                     // at once: during the start
      logged("^> memory", 1),                                 // configuration read, nothing written yet
      logged("^> writing", 1),                                // metrics.h5 created or continued
      logged("] iteration", 1),                               // right after the first flush
      logged("] iteration", 1) + "sleep 0.003; ",             // within the next iteration
      logged("] iteration", 2) + "sleep 0.007; ",             // within a checkpoint write or the step after
      logged("] iteration", 3) + "sleep 0.001; ",
      logged("] iteration", 4),                               // surely after a flush and a checkpoint
  };
  int last = 0;
  for (const std::string& wait_for : waits) {
    const auto r = mb::testing::run_command(cmd + " > " + log.string() + " 2>&1 & pid=$!; " + wait_for +
                                            "kill -9 $pid; wait $pid; echo killed=$?");
    ASSERT_NE(r.output.find("killed=137"), std::string::npos)
        << "the run (a million iterations) ended before the kill after `" << wait_for << "`: " << r.output
        << mb::testing::read_text(log);
    if (!fs::exists(run / "metrics.h5")) continue;  // killed before its first write
    const std::string seen = check_metrics(run / "metrics.h5");
    ASSERT_EQ(seen.rfind("ok ", 0), 0u) << "after kill -9 following `" << wait_for << "`: " << seen;
    last = std::stoi(seen.substr(3));
  }
  EXPECT_GT(last, 0) << "the kill after four logged intervals found none in metrics.h5";
  // The last attempt, with a reader opening the file over and over while the run writes it
  // (and reading train/iteration, which a run that started afresh has not written before its
  // first flush). Once the reader has seen the file grow three times, it stops the run with
  // SIGUSR1 (a checkpoint at the end of the iteration, exit 3), and reads on until the run
  // has ended.
  const auto r = mb::testing::run_command(
      cmd + " > " + log.string() + " 2>&1 & pid=$!; /usr/bin/python3 -c \"import h5py, os, signal, time\n"
      "opened = failed = 0; sizes = set(); stopped = False; deadline = time.time() + 600\n"
      "while True:\n"
      "    try:\n"  // exited and not yet waited for (a zombie), or gone: reaped between two looks
      "        done = open('/proc/$pid/stat').read().split()[2] == 'Z'\n"
      "    except OSError:\n"
      "        done = True\n"
      "    try:\n"
      "        with h5py.File('" + (run / "metrics.h5").string() + "', 'r') as f:\n"
      "            'train' in f and sizes.add(len(f['train/iteration'][:]))\n"
      "        opened += 1\n"
      "    except Exception as e:\n"
      "        failed += 1; print(e)\n"
      "    if done: break\n"
      "    if not stopped and (len(sizes) >= 4 or time.time() > deadline):\n"
      "        os.kill($pid, signal.SIGUSR1); stopped = True\n"
      "    time.sleep(0.01)\n"
      "print('opened', opened, 'failed', failed, 'sizes seen', len(sizes))\"; wait $pid; echo exit=$?");
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << "stopped by SIGUSR1 at a checkpoint: " << r.output
                                                        << mb::testing::read_text(log);
  EXPECT_NE(r.output.find("failed 0"), std::string::npos) << "a reader could not open metrics.h5 while the run wrote it:\n"
                                                           << r.output;
  const size_t sizes = r.output.find("sizes seen ");
  ASSERT_NE(sizes, std::string::npos) << r.output;
  EXPECT_GE(std::stoi(r.output.substr(sizes + 11)), 4) << "the reader saw the run write: " << r.output;
  const std::string stopped_at = mb::testing::read_text(ckpt / "latest_checkpointed_iteration.txt");
  ASSERT_FALSE(stopped_at.empty());
  EXPECT_EQ(check_metrics(run / "metrics.h5"), "ok " + stopped_at) << "every iteration once, in order, up to the stop";
  EXPECT_GT(std::stoi(stopped_at), last) << "the last attempt went on from the earlier ones";
  for (const auto& e : fs::directory_iterator(run)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
}

TEST(Durability, AFullDiskIsAClearErrorThatLosesNothing) {
  mb::testing::TempDir tmp;
  const fs::path disk = tmp / "disk", run = disk / "run", ckpt = disk / "ckpt";
  fs::create_directories(disk);
  (void)mb::testing::brown_data();  // made outside the small disk
  // A checkpoint of this model (1.6 M parameters, AdamW) is 19.5 MB: the second does not fit
  // in 30 MB. Everything is checked inside the namespace that has the mount.
  const auto r = mb::testing::run_command(
      "unshare -m sh -c '"
      "mount -t tmpfs -o size=30m tmpfs " + disk.string() + " || { echo cannot mount a tmpfs: needs root; exit 0; }; " +
      train(run, ckpt, "--train-iters 10 --save-interval 2") + " > " + (tmp / "log").string() + " 2>&1; echo exit=$?; "
      "ls " + ckpt.string() + "; cat " + (ckpt / "latest_checkpointed_iteration.txt").string() + "; " +
      "/usr/bin/python3 -c \"import h5py; f = h5py.File(\\\"" + (run / "metrics.h5").string() +
      "\\\", \\\"r\\\"); print(\\\"metrics rows\\\", len(f[\\\"train/iteration\\\"]))\"; " +
      "/usr/bin/python3 -c \"import h5py; f = h5py.File(\\\"" + (ckpt / "iter_0000002.h5").string() +
      "\\\", \\\"r\\\"); print(\\\"checkpoint iteration\\\", f.attrs[\\\"iteration\\\"])\"'");
  const std::string log = mb::testing::read_text(tmp / "log");
  ASSERT_EQ(r.output.find("cannot mount"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exit=1"), std::string::npos) << "an error, not a crash:\n" << r.output << log;
  EXPECT_NE(log.find("iter_0000004.h5.tmp: cannot write"), std::string::npos) << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  EXPECT_NE(log.find("the checkpoint of iteration 2 is intact (resume from it with --load"), std::string::npos) << log;
  EXPECT_EQ(r.output.find(".tmp"), std::string::npos) << "the unfinished checkpoint was removed:\n" << r.output;
  EXPECT_NE(r.output.find("iter_0000002.h5\nlatest_checkpointed_iteration.txt\n2\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("metrics rows 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint iteration 2"), std::string::npos) << r.output;
}

TEST(Durability, UnfinishedCheckpointFilesGoAtTheNextStartAndNothingElseDoes) {
  mb::testing::TempDir tmp;
  const fs::path ckpt = tmp / "ckpt";
  fs::create_directories(ckpt);
  for (const char* name : {"iter_0000004.h5.tmp", "latest_checkpointed_iteration.txt.tmp", "notes.tmp", "iter_4.h5.tmp"})
    mb::testing::write_text(ckpt / name, "x");
  fs::create_directories(tmp / "elsewhere");
  mb::testing::write_text(tmp / "elsewhere" / "iter_0000006.h5.tmp", "precious");
  fs::create_symlink(tmp / "elsewhere" / "iter_0000006.h5.tmp", ckpt / "iter_0000006.h5.tmp");
  const auto r = mb::testing::run_command(train(tmp / "run", ckpt, "--train-iters 2 --save-interval 2") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(ckpt / "iter_0000004.h5.tmp"));
  EXPECT_FALSE(fs::exists(ckpt / "latest_checkpointed_iteration.txt.tmp"));
  EXPECT_TRUE(fs::exists(ckpt / "notes.tmp")) << "not megabatch's";
  EXPECT_TRUE(fs::exists(ckpt / "iter_4.h5.tmp")) << "not a name megabatch writes";
  EXPECT_TRUE(fs::is_symlink(ckpt / "iter_0000006.h5.tmp")) << "symlinks are not removed";
  EXPECT_EQ(mb::testing::read_text(tmp / "elsewhere" / "iter_0000006.h5.tmp"), "precious");
  EXPECT_TRUE(fs::exists(ckpt / "iter_0000002.h5"));
}

// One run per directory: while a run goes on, a second train given its --run-dir, or only its
// --save, is refused naming it and writes nothing; killed with -9, the run leaves no lock
// behind, and the next run into the same directories starts.
TEST(Durability, ASecondRunIntoARunningRunsDirectoriesIsRefusedAndAKilledRunLeavesNoLock) {
  mb::testing::TempDir tmp;
  const fs::path run = tmp / "run", ckpt = tmp / "ckpt", log = tmp / "log";
  auto r = mb::testing::run_command(train(run, ckpt, "--train-iters 1000000 --save-interval 2") + " > " + log.string() +
                                    " 2>&1 & pid=$!; echo pid=$pid; until [ $(grep -c '] iteration' " + log.string() +
                                    ") -ge 3 ] || ! kill -0 $pid; do sleep 0.02; done; kill -0 $pid && echo running");
  ASSERT_NE(r.output.find("running"), std::string::npos) << r.output << mb::testing::read_text(log);
  const std::string pid = r.output.substr(4, r.output.find('\n') - 4);
  auto kill_first = [&] {
    mb::testing::run_command("kill -9 " + pid + "; while [ -e /proc/" + pid + " ] && [ \"$(cut -d' ' -f3 /proc/" + pid +
                             "/stat)\" != Z ]; do sleep 0.02; done");
  };
  const std::string holder = " is in use by train (pid " + pid + " on host ";
  const std::string config = mb::testing::read_text(run / "config.json");
  ASSERT_NE(config.find("\"train_iters\": 1000000"), std::string::npos) << config;

  const auto same_dirs = mb::testing::run_command(train(run, ckpt, "--train-iters 2") + " 2>&1");
  EXPECT_NE(same_dirs.exit_code, 0) << same_dirs.output;
  EXPECT_NE(same_dirs.output.find(run.string() + holder), std::string::npos) << same_dirs.output;
  EXPECT_NE(same_dirs.output.find("give this run another --run-dir"), std::string::npos) << same_dirs.output;

  const auto same_save = mb::testing::run_command(train(tmp / "other", ckpt, "--train-iters 2") + " 2>&1");
  EXPECT_NE(same_save.exit_code, 0) << same_save.output;
  EXPECT_NE(same_save.output.find(ckpt.string() + holder), std::string::npos) << same_save.output;
  EXPECT_NE(same_save.output.find("give this run another --save"), std::string::npos) << same_save.output;
  EXPECT_FALSE(fs::exists(tmp / "other" / "config.json")) << "the refused run wrote nothing";

  EXPECT_EQ(mb::testing::read_text(run / "config.json"), config) << "the refused run left the first's configuration";
  kill_first();
  EXPECT_EQ(check_metrics(run / "metrics.h5").rfind("ok ", 0), 0u) << "the first run's metrics are its own";
  r = mb::testing::run_command(train(run, ckpt, "--train-iters 2") + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << "the killed run left a lock behind: " << r.output;
}
