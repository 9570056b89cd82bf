// `lockstep`: the command-line entry point. Dispatches to a subcommand; bad input (ConfigError,
// DataError) is printed as one line `error: ...` and exits with status 2 — under mpirun/srun once,
// by rank 0: what reaches here every rank meets alike (the config, the layout, the files all read;
// an error of one rank's own, past the set-up, ends the job where it arises:
// src/train/trainer.cpp); an internal error (a bug) exits with status 3; a run stopped on a
// detector's finding exits with the finding's code (verify/detect/finding.hpp), rank 0 saying why.
#include <chrono>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <thread>

#include "src/cli/commands.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "verify/detect/finding.hpp"

namespace {

constexpr const char* kUsage = R"(usage: lockstep <command> [options]

commands:
  train --config FILE [--section.key=value ...]   train (resumes from the newest checkpoint)
  data synth --out DIR [...]                        synthetic source with a known entropy rate
  data build --input PATH --out DIR [...]           text files -> llm.c token files
  data inspect FILE                                 validate a token file and print its header
  ckpt info DIR                                     tensors, hashes and the model hash
  ckpt verify DIR                                   every checkpoint of a root: whole or why not
  ckpt export DIR|--config FILE OUT                 parameters as safetensors
  verify step --config FILE --checkpoint DIR        one step in trainer and reference, per tensor
  diff A B [--bounds] [--plot DIR] [--json FILE]    compare two tensor dumps (train --dump.dir)
  bisect --a='ARGS' --b='ARGS' --steps=N [...]      first step and op where two runs diverge
  bench --config FILE [--json FILE]                 time the training step: tokens/s, MFU, phases
  faultcampaign --config FILE [--np N] [--faults N] plant faults in a run; what the detectors catch
  launch [--np N] [--max-restarts R] -- COMMAND...  supervise a job: restart it from its checkpoint
  schedule --pp P --microbatches M [--schedule K]   a pipeline schedule: passes, timeline, bubble
  fp8 report METRICS.jsonl [--out FILE.svg]         an fp8 run's quantization: worst layers, findings
  moe report METRICS.jsonl [--out FILE.svg]         a MoE run's routing: expert load, drops, entropy
  plan --model F --cluster F --global-batch B       rank parallel layouts of a run on a cluster

Run `lockstep <command> --help` for the options of one command.
)";

// This process's rank in the job under mpirun/srun (-1 otherwise). A rank above 0 first holds its
// exit a moment: mpirun ends the job at the first non-zero exit, and rank 0 is to print the reason.
int hold_unless_rank0() {
  const int rank = lockstep::comm::MpiRuntime::job_rank();
  if (rank > 0) std::this_thread::sleep_for(std::chrono::seconds(3));
  return rank;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "launch") return cli::cmd_launch(argc, argv);
    cli::Args args(argc, argv, 2);
    if (command == "train") return cli::cmd_train(args);
    if (command == "data") return cli::cmd_data(args);
    if (command == "ckpt") return cli::cmd_ckpt(args);
    if (command == "verify") return cli::cmd_verify(args);
    if (command == "diff") return cli::cmd_diff(args);
    if (command == "bisect") return cli::cmd_bisect(args);
    if (command == "bench") return cli::cmd_bench(args);
    if (command == "faultcampaign") return cli::cmd_faultcampaign(args);
    if (command == "schedule") return cli::cmd_schedule(args);
    if (command == "plan") return cli::cmd_plan(args);
    if (command == "fp8") return cli::cmd_fp8(args);
    if (command == "moe") return cli::cmd_moe(args);
    std::cerr << "error: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const detect::FaultStop& e) {
    // Every rank stops at the same finding; rank 0 printed it and says why the job ends.
    if (hold_unless_rank0() <= 0) std::cerr << e.what() << "\n";
    return e.exit_code();
  } catch (const InputError& e) {
    // An error rank 0 did not meet follows after its line, from its own rank.
    if (const int rank = hold_unless_rank0(); rank > 0) std::cerr << "rank " << rank << ": ";
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const InternalError& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 3;
  } catch (const std::bad_alloc&) {
    if (const int rank = hold_unless_rank0(); rank > 0) std::cerr << "rank " << rank << ": ";
    std::cerr << "error: out of memory: a buffer could not be allocated within this process's memory limit; a layout "
                 "that splits the model or its activations further (tp, cp, pp, zero 3, a smaller micro-batch, "
                 "recomputation) needs less per rank\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
}
