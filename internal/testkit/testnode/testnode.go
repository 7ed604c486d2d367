// Package testnode starts a real engine for other packages' tests (embedded NATS, Pebble
// in a temporary dir), stopped at the test's end. For tests only.
package testnode

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
)

// Lease is the tests' lease: a second's TTL, quick backoffs.
var Lease = epoch.Config{TTL: time.Second, Backoff: backoff.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}}

// Engine starts an engine named node-a, its NATS embedded on a free loopback port and
// its state in a temporary dir, with Lease; mod changes that configuration first. It
// stops at the test's end.
func Engine(t testing.TB, mod func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.Config{NodeID: "node-a", DataDir: filepath.Join(t.TempDir(), "data"), NATSListen: "127.0.0.1:0", Lease: Lease}
	if mod != nil {
		mod(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	return e
}
