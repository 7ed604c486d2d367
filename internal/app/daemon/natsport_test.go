package daemon

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flowd whose NATS port is taken stops at once, naming the address and the flag to
// change it; it once waited 10 s and named neither flag nor fix (issue 38).
func TestNATSPortInUseNamesTheFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	dir := t.TempDir()
	cfg, err := Load([]string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", addr, "--http", "off", "--node-id", "n1"}, []string{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	d, err := Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		d.Stop()
		t.Fatalf("flowd started on %s, which is taken", addr)
	}
	for _, want := range []string{addr, "address already in use", "--nats-listen"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v; want it to say %q", err, want)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("flowd took %s to give up; want well under the 10 s of readiness", took)
	}
}
