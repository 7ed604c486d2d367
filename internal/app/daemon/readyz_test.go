package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/natsnode"
)

// startDaemon starts flowd with HTTP on a free port and the given extra flags.
func startDaemon(t *testing.T, dir string, flags ...string) *Daemon {
	t.Helper()
	args := append([]string{"--data-dir", filepath.Join(dir, "data"), "--http", "127.0.0.1:0", "--node-id", "n1",
		"--lease-ttl", "1s", "--drain-timeout", "2s"}, flags...)
	cfg, err := Load(args, []string{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitReady polls /readyz (an HTTP endpoint: there is nothing to wait on but its answer)
// until it answers code with a body containing want, or the deadline passes.
func waitReady(t *testing.T, d *Daemon, code int, want string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	var lastCode int
	var lastBody string
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		lastCode, lastBody = get(t, "http://"+d.HTTPAddr()+"/readyz")
		if lastCode == code && strings.Contains(lastBody, want) {
			return lastBody
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz answered %d %q for %s; want %d with %q", lastCode, lastBody, within, code, want)
		}
		<-tick.C
	}
}

// A node whose applier stopped (the log holds a message of a newer format than this
// code reads: it must not apply further) is not ready, and /readyz says why.
func TestReadyzFailsWhenTheApplierStopped(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--nats-listen", "127.0.0.1:0", "--scheduler=false")
	defer d.Stop()
	waitReady(t, d, http.StatusOK, "ready", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Engine().Conn().Publish("flow.log", []byte(`{"v":999,"node":"future","entries":[]}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Engine().ApplierFailed():
	case <-ctx.Done():
		t.Fatal("the applier did not stop on a message of a newer format")
	}
	code, body := get(t, "http://"+d.HTTPAddr()+"/readyz")
	// Its own check's line (the log consumer's supervised part reports the same stop
	// in its own words).
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the applier stopped: ") || !strings.Contains(body, "revision 999") {
		t.Fatalf("/readyz %d %q; want 503 saying the applier stopped, and why", code, body)
	}
	// /healthz is about the process, not the node's state: still ok.
	if code, body := get(t, "http://"+d.HTTPAddr()+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d %q", code, body)
	}
}

// A node that cannot reach NATS (here an external server that went away) is not ready
// and says so; once the server is back, it is ready again.
func TestReadyzFailsWhileNATSIsUnreachable(t *testing.T) {
	natsDir := t.TempDir()
	srv, err := natsnode.Start(natsnode.Config{DataDir: natsDir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	stopped := false
	defer func() {
		if !stopped {
			srv.Shutdown()
		}
	}()
	d := startDaemon(t, t.TempDir(), "--nats-url", url, "--scheduler=false")
	defer d.Stop()
	waitReady(t, d, http.StatusOK, "ready", 5*time.Second)
	srv.Shutdown()
	stopped = true
	waitReady(t, d, http.StatusServiceUnavailable, "NATS is not reachable", 10*time.Second)
	// The server comes back on the same address and store: the node is ready again.
	srv, err = natsnode.Start(natsnode.Config{DataDir: natsDir, Listen: strings.TrimPrefix(url, "nats://")})
	if err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitReady(t, d, http.StatusOK, "ready", 15*time.Second)
}
