#include "sana/distributed/launcher_link.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

#include "sana/util/exit_codes.h"

namespace sana::dist {

void exit_with_launcher() {
  const char* fd_text = std::getenv(kLifelineVariable);
  if (fd_text == nullptr) return;
  const int fd = std::atoi(fd_text);
  if (fd <= 2 || fcntl(fd, F_GETFD) < 0) return;
  fcntl(fd, F_SETFD, FD_CLOEXEC);  // our own children need not hold it
  std::thread([fd] {
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR) {
    }
    const char msg[] = "sana-train: the launcher is gone; stopping\n";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    std::_Exit(kExitPeerFailed);
  }).detach();
}

void tell_launcher(const std::string& line) {
  const char* fd_text = std::getenv(kMessagesVariable);
  if (fd_text == nullptr) return;
  const int fd = std::atoi(fd_text);
  if (fd <= 2 || fcntl(fd, F_GETFD) < 0) return;
  const std::string out = line + "\n";  // one write of under PIPE_BUF bytes: never interleaved
  (void)!write(fd, out.data(), out.size());
}

}  // namespace sana::dist
