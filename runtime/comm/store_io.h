// Socket I/O shared by the store clients (TcpStore, C10dStore) and
// TcpStore's server: every call has a deadline, none raises SIGPIPE.
// Internal to runtime/comm.
#ifndef SHARDKIT_RUNTIME_COMM_STORE_IO_H_
#define SHARDKIT_RUNTIME_COMM_STORE_IO_H_

#include <sys/socket.h>

#include <chrono>
#include <string>

#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace sk::comm::store_io {

using Clock = std::chrono::steady_clock;

// "what: strerror(errno)".
std::string Errno(const char* what);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT), in polls of at
// most a second. DeadlineExceeded(`late`) once `deadline` has passed (checked
// before each poll, so also when the fd is ready then), Unavailable if poll
// fails.
Status WaitReady(int fd, short events, Clock::time_point deadline, const char* late);

// Sends all of `len` bytes before `deadline` (a peer that stops reading
// fills the socket buffer: the send must not block for ever).
Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline);

// Receives exactly `len` bytes before `deadline`; Unavailable when the peer
// closes the connection first.
Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline);

// Connects `fd` to `addr` before `deadline` (a blocking connect to a host
// that drops SYNs, or to a listener whose backlog is full, waits minutes).
Status ConnectBefore(int fd, const sockaddr* addr, socklen_t addrlen, Clock::time_point deadline);

// A connected TCP socket (TCP_NODELAY) to host:port, retrying every 50 ms
// until `timeout` (the server may start after its clients). Unavailable if
// `host` does not resolve; DeadlineExceeded naming host:port and the last
// error when nothing answered in time.
StatusOr<int> ConnectWithRetry(const std::string& host, int port, Duration timeout);

}  // namespace sk::comm::store_io

#endif  // SHARDKIT_RUNTIME_COMM_STORE_IO_H_
