// The `lockstep` subcommands. Each returns the process exit code; bad input throws ConfigError or
// DataError, which main() prints as one line before exiting with status 2.
#pragma once

#include "src/cli/args.hpp"

namespace lockstep::cli {

int cmd_train(Args& args);  // lockstep train --config FILE [--section.key=value ...]
int cmd_data(Args& args);   // lockstep data build|synth ...
int cmd_ckpt(Args& args);   // lockstep ckpt info DIR
int cmd_verify(Args& args); // lockstep verify step --config FILE --checkpoint DIR
int cmd_diff(Args& args);   // lockstep diff A B [--json FILE] [--mode=exact|ulp:N]
int cmd_bisect(Args& args); // lockstep bisect --a='ARGS' --b='ARGS' --steps=N [...]
int cmd_bench(Args& args);  // lockstep bench --config FILE [--json FILE]
int cmd_faultcampaign(Args& args);  // lockstep faultcampaign --config FILE [--np N] [--faults N] [--out DIR]
int cmd_schedule(Args& args);       // lockstep schedule --pp P --microbatches M [--schedule K] [...]
int cmd_fp8(Args& args);            // lockstep fp8 report METRICS.jsonl [--out FILE.svg] [--top N]
int cmd_moe(Args& args);            // lockstep moe report METRICS.jsonl [--out FILE.svg]
int cmd_plan(Args& args);           // lockstep plan --model FILE --cluster FILE|local [--validate] [...]
int cmd_launch(int argc, char** argv);  // lockstep launch [options] -- COMMAND... (its own `--`)

}  // namespace lockstep::cli
