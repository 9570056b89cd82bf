// Child processes for bisect (child_process.hpp).
#include "verify/child_process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>

#include "src/core/check.hpp"

extern char** environ;

namespace lockstep::verify {

ChildExit run_child(const std::vector<std::string>& argv, const std::string& log_path) {
  LS_CHECK(!argv.empty(), "run_child: empty argv");
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(str_cat(log_path, ": open failed: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fd);
  if (rc != 0) throw DataError(str_cat(argv[0], ": cannot start: ", std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw DataError(str_cat(argv[0], ": waitpid failed: ", std::strerror(errno)));
  }
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), true};
  return {WEXITSTATUS(status), false};
}

std::string current_executable() {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
  if (n <= 0) throw DataError(str_cat("/proc/self/exe: readlink failed: ", std::strerror(errno)));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

std::string tail_of_file(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

}  // namespace lockstep::verify
