// Copyright 2026 The ckptd Authors.
//
// HttpServer: the daemon's HTTP endpoint, a small HTTP/1.1 server of its own
// on one thread (epoll, non-blocking sockets).
//
//   GET /metrics   200, Content-Type "text/plain; version=0.0.4", the body
//                  of HttpServerOptions::metrics (Prometheus text format)
//   GET /healthz   200 "ok" when HttpServerOptions::health is OK; else 503
//                  with the reason
//   HEAD           the same status and headers, no body
//   anything else  404 (405 for other methods on those two paths)
//
// Slow or broken clients cannot starve the probes: a request is handled only
// once its whole head (request line and headers) has arrived, so a slow
// ("slowloris") or silent connection costs a table slot, never a thread.
// Everything is bounded: at most max_connections connections (accepting one
// more closes the one that has waited longest for its request), heads of at
// most max_request_head_bytes (else 431), request_timeout for a head to
// arrive, idle_timeout for a connection with no request under way,
// write_timeout for a client that does not read its answer. No endpoint
// takes a body: a request with one is refused (413, or 404/405) and its
// connection closed.
//
// Thread-safety: the callbacks run on the server's thread, one call at a
// time (concurrently with the caller's other threads); they must stay valid
// until Stop() or destruction. The server answers nothing else while one
// runs: they should take milliseconds.
#ifndef CKPTD_DAEMON_METRICS_HTTP_SERVER_H_
#define CKPTD_DAEMON_METRICS_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckptd::daemon {

struct HttpServerOptions {
  // "host:port", "[v6]:port" or ":port" (all interfaces); port 0 picks a
  // free one (see HttpServer::port()).
  std::string listen;
  // The /metrics body. Unset: 404.
  std::function<std::string()> metrics;
  // The /healthz verdict. Unset: always OK.
  std::function<absl::Status()> health;
  // Open connections at most (>= 1). Accepting one more closes the one that
  // has waited longest for (the rest of) a request, so a new probe always
  // gets a slot.
  int max_connections = 256;
  // A request line plus headers longer than this: 431, closed.
  int max_request_head_bytes = 8 << 10;
  // A request head must be complete this long after its first byte arrived;
  // else the connection is closed (slow clients).
  absl::Duration request_timeout = absl::Seconds(2);
  // A connection with no request under way (just accepted, or kept alive
  // after an answer) is closed after this.
  absl::Duration idle_timeout = absl::Seconds(2);
  // An answer the client has not taken within this is dropped with its
  // connection (a client that does not read).
  absl::Duration write_timeout = absl::Seconds(5);
};

// "host:port" → (host, port). INVALID_ARGUMENT naming `listen` if malformed.
absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(
    const std::string& listen);

class HttpServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for a malformed address or
  // option, UNAVAILABLE if the address cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(
      HttpServerOptions options);
  // Stops (see Stop()).
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port.
  int port() const;
  // The bound host (as given; "0.0.0.0" for ":port").
  const std::string& host() const;

  // Stops listening, closes every connection (an answer not yet taken by
  // its client is dropped) and joins the thread; prompt whatever the
  // clients do. The callbacks are not called after it returns. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_METRICS_HTTP_SERVER_H_
