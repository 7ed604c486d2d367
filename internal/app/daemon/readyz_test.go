package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/testkit/forge"
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
	if _, err := forge.Open(t, d.Engine().ClientURL()).Publish(ctx, []byte(`{"v":999,"node":"future","entries":[]}`)); err != nil {
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

// A part that keeps stopping makes the node not ready, and /readyz says which part, why
// it stopped and how often in a row; /metrics counts its restarts by part. Once it runs
// again the node is ready again.
func TestReadyzSaysWhichPartIsRestartingAndWhy(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--nats-listen", "127.0.0.1:0", "--scheduler=false")
	defer d.Stop()
	waitReady(t, d, http.StatusOK, "ready", 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var fail atomic.Bool
	fail.Store(true)
	// A part of its own under the node's supervisor, beside the API service's.
	_, sup, _ := d.Engine().API().Hosting()
	done := sup.Go(ctx, supervise.Part{Name: "test-part", Run: func(ctx context.Context, alive func()) error {
		if fail.Load() {
			return errors.New("watch closed by the test")
		}
		alive()
		<-ctx.Done()
		return nil
	}})
	// Its backoff grows (100ms to 2s, jittered): once it has been restarted twice, the
	// readyz line names it, why, and its restart count in a row.
	deadline := time.Now().Add(10 * time.Second)
	for sup.RestartsByPart()["test-part"] < 2 {
		if time.Now().After(deadline) {
			t.Fatal("test-part was not restarted twice")
		}
		time.Sleep(10 * time.Millisecond) // polling a counter: nothing to wait on
	}
	body := waitReady(t, d, http.StatusServiceUnavailable, "test-part: stopped (watch closed by the test); restart ", 10*time.Second)
	if !strings.Contains(body, " in a row in ") || strings.Contains(body, "restart 1 in a row") {
		t.Fatalf("/readyz %q: want test-part's restart count in a row (at least 2) and when", body)
	}
	_, body = get(t, "http://"+d.HTTPAddr()+"/metrics")
	if !strings.Contains(body, `flow_part_restarts_total{part="test-part"} `) || strings.Contains(body, `flow_part_restarts_total{part="test-part"} 0`) ||
		strings.Contains(body, `flow_part_restarts_total{part="test-part"} 1`+"\n") {
		t.Fatalf("/metrics does not count test-part's restarts:\n%s", body)
	}
	fail.Store(false)
	waitReady(t, d, http.StatusOK, "ready", 10*time.Second)
	cancel()
	<-done
}
