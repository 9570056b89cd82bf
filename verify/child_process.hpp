// Running another program (a `lockstep train` side of `lockstep bisect`) as a child process with
// its stdout and stderr in a log file, and waiting for it. posix_spawnp: no shell in between, so
// arguments reach the child exactly as given.
// Not here: what the child is or how its output is read (verify/bisect.cpp).
#pragma once

#include <string>
#include <vector>

namespace lockstep::verify {

struct ChildExit {
  int status = 0;  // exit status; 128 + N when killed by signal N
  bool signaled = false;
};

// Runs argv[0] (looked up in PATH when it has no '/') with argv, stdout and stderr appended to
// `log_path`, and waits. DataError naming the program when it cannot be started.
ChildExit run_child(const std::vector<std::string>& argv, const std::string& log_path);

// The absolute path of the running executable (/proc/self/exe).
std::string current_executable();

// The last `lines` lines of a text file ("" if it cannot be read), for error messages.
std::string tail_of_file(const std::string& path, int lines);

}  // namespace lockstep::verify
