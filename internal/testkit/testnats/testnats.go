// Package testnats starts a bare nats-server (the library) for tests of what talks to
// one: users, permissions, TLS. It imports nothing of flow, so any package's tests may
// use it. For tests only.
package testnats

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server starts a nats-server on 127.0.0.1 (a free port) as opts says, quiet, and
// waits until it takes connections. It shuts down at the test's end.
func Server(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready for connections within 10s")
	}
	return s
}
