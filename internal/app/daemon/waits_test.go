package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// /metrics counts the parked runs by what they wait for, and the signals and decisions
// the API wrote.
func TestMetricsOfWaits(t *testing.T) {
	dir := t.TempDir()
	cfg, err := Load([]string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--node-id", "n1", "--lease-ttl", "1s"}, []string{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	e := d.Engine()
	if _, err := d.api.Do(ctx, "workflow.apply", client.Request{File: "gate.yaml", YAML: "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: go}}\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.api.Do(ctx, "run.start", client.Request{Workflow: "gate", ID: "g1"}); err != nil {
		t.Fatal(err)
	}
	for {
		changed := e.Changed()
		if r, err := e.API().Run("g1"); err == nil && r.Status == "waiting" {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the run never parked")
		}
	}
	base := "http://" + d.HTTPAddr()
	metrics := func(wants ...string) {
		t.Helper()
		_, body := get(t, base+"/metrics")
		for _, want := range wants {
			if !strings.Contains(body, want+"\n") {
				t.Fatalf("/metrics lacks %q:\n%s", want, body)
			}
		}
	}
	metrics(`flow_runs_parked{kind="signal"} 1`, `flow_runs_parked{kind="approval"} 0`, `flow_runs_parked{kind="timer"} 0`,
		"flow_signals_total 0", `flow_approvals_total{decision="approve"} 0`, `flow_approvals_total{decision="reject"} 0`)
	if _, err := d.api.Do(ctx, "run.signal", client.Request{ID: "g1", Name: "go"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitRun(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	metrics(`flow_runs_parked{kind="signal"} 0`, "flow_signals_total 1")
}
