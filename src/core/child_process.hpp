// Running another program as a child process and waiting for it: a `lockstep train` side of
// `lockstep bisect` or a campaign's run, with its output in a log file; or the job `lockstep launch`
// supervises, its output read line by line as it comes. posix_spawnp: no shell in between, so
// arguments reach the child exactly as given.
// Not here: what the child is or how its output is judged (verify/bisect.cpp, src/train/launch.cpp).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

struct ChildExit {
  int status = 0;  // exit status; 128 + N when killed by signal N
  bool signaled = false;
};

// Runs argv[0] (looked up in PATH when it has no '/') with argv, stdout and stderr appended to
// `log_path`, and waits. DataError naming the program when it cannot be started.
ChildExit run_child(const std::vector<std::string>& argv, const std::string& log_path);

// Runs argv as run_child does, in a process group of its own, its stdout and stderr merged into a
// pipe: started(pid) once it runs, then on_line(line) for every line it writes (without the
// newline; a last line without one too), and its exit once the pipe is closed and it has ended.
ChildExit run_child_lines(const std::vector<std::string>& argv, const std::function<void(pid_t)>& started,
                          const std::function<void(std::string_view)>& on_line);

// The absolute path of the running executable (/proc/self/exe).
std::string current_executable();

// The last `lines` lines of a text file ("" if it cannot be read), for error messages.
std::string tail_of_file(const std::string& path, int lines);

}  // namespace lockstep
