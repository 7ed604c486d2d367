package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/testkit/forge"
	"github.com/flowrun/flow/steps"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "flowd.yaml")
	if err := os.WriteFile(file, []byte("workers: 3\nlease-ttl: 20s\nnode-id: from-file\nhttp: 127.0.0.1:9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", file, "--workers", "5"}, []string{"FLOWD_LEASE_TTL=15s", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	// flag > env > file > default
	if c.Workers != 5 || c.LeaseTTL != 15*time.Second || c.NodeID != "from-file" || c.HTTP != "127.0.0.1:9000" || c.DataDir != "./flow-data" {
		t.Fatalf("config %+v", c)
	}
	c, err = Load(nil, []string{"FLOWD_CONFIG=" + file, "FLOWD_NODE_ID=from-env"})
	if err != nil || c.NodeID != "from-env" || c.Workers != 3 {
		t.Fatalf("config %+v %v", c, err)
	}
	c, err = Load(nil, nil)
	if err != nil || c.NATSListen != "127.0.0.1:4222" || c.HTTP != "127.0.0.1:8080" || c.LeaseTTL != 10*time.Second || c.Workers != 8 {
		t.Fatalf("defaults %+v %v", c, err)
	}
}

func TestConfigErrorsNameTheKeyAndTheFix(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("workers: 2\nworkres: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--workers", "0"}, nil, "workers: \"0\": use a whole number from 1 to 10000"},
		{[]string{"--lease-ttl", "500ms"}, nil, "lease-ttl: \"500ms\": use a duration of at least 1s"},
		{[]string{"--http", "8080"}, nil, "http: \"8080\": use HOST:PORT"},
		{[]string{"--nats-url", "127.0.0.1:4222"}, nil, "nats-url: \"127.0.0.1:4222\": use nats://HOST:PORT"},
		{[]string{"--nats-url", "nats://x:4222", "--nats-listen", "127.0.0.1:1"}, nil, "cannot be used with --nats-url"},
		{[]string{"--nats-admin-creds", filepath.Join(dir, "admin.creds")}, nil, "nats-admin-creds: is for joining a NATS server with --nats-url"},
		{[]string{"--nats-url", "nats://x:4222", "--nats-admin-creds", filepath.Join(dir, "none.creds")}, nil, "nats-admin-creds: \"" + filepath.Join(dir, "none.creds") + "\" is not a readable file"},
		{[]string{"--node-id", "a/b"}, nil, "node-id"},
		{[]string{"--log-format", "xml"}, nil, "log-format"},
		{[]string{"--workflows", filepath.Join(dir, "none")}, nil, "is not a directory"},
		{[]string{"--bogus"}, nil, "unknown flag: --bogus"},
		{[]string{"extra"}, nil, "unexpected argument"},
		{nil, []string{"FLOWD_WORKERZ=3"}, "unknown environment variable FLOWD_WORKERZ"},
		{[]string{"--config", bad}, nil, "unknown key \"workres\""},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, nil, "config file"},
	} {
		_, err := Load(c.args, c.env)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%v, %v) = %v; want %q", c.args, c.env, err, c.want)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The daemon serves health and metrics; a fenced commit shows up in /metrics.
func TestDaemonHealthAndMetrics(t *testing.T) {
	dir := t.TempDir()
	wfDir := filepath.Join(dir, "wf")
	if err := os.MkdirAll(wfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wfDir, "hello.yaml"), []byte("name: hello\nsteps:\n  - name: a\n    uses: noop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load([]string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--node-id", "n1", "--lease-ttl", "1s", "--workflows", wfDir, "--scheduler=false"}, []string{})
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
	base := "http://" + d.HTTPAddr()
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz %d %q", code, body)
	}
	if _, err := d.Engine().Workflow("hello", 0); err != nil {
		t.Fatalf("--workflows did not apply hello: %v", err)
	}
	// A zombie's commit: fenced, and counted.
	// Written as a foreign writer would (internal/testkit/forge); the node's state, once
	// caught up, says what it accepted.
	w := forge.Open(t, d.Engine().ClientURL())
	write := func(e checkpoint.Entry) uint64 {
		t.Helper()
		seq, err := w.Write(ctx, e)
		if err != nil {
			t.Fatalf("entry %s: %v", e.Kind, err)
		}
		return seq
	}
	// The set-up: a run claimed in one epoch, then taken over in a second. Each entry
	// must be accepted, or the fenced commit below proves nothing.
	write(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: "z1", Submit: &checkpoint.Submit{Workflow: "zz", Trigger: "manual", Steps: []checkpoint.StepSpec{{Name: "a"}}}})
	e1 := write(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "z1", Term: 999999})
	write(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "z1", Epoch: int64(e1), Owner: "w"})
	e2 := write(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "z1", Epoch: int64(e1), Term: 999999})
	write(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "z1", Epoch: int64(e2), Owner: "w2"})
	if err := d.Engine().CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := d.Engine().Run("z1"); err != nil || v.Run.Epoch != int64(e2) || v.Run.Owner != "w2" {
		t.Fatalf("the set-up was not accepted: %+v %v", v, err)
	}
	write(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "z1", Step: "a", Item: -1, Epoch: int64(e1), Owner: "w", Output: json.RawMessage(`{}`)})
	if err := d.Engine().CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := d.Engine().Run("z1"); err != nil || len(v.Fenced) != 1 || v.Steps[0].Status != checkpoint.StepPending {
		t.Fatalf("the zombie's commit was not fenced: %+v %v", v, err)
	}
	_, body := get(t, base+"/metrics")
	// (No scheduler on this node: the test writes the scheduler's entries itself.)
	for _, want := range []string{`flow_commits_total{result="fenced"} 1`, "flow_is_leader 0", `flow_runs{status="running"} 1`, "flow_epoch_changes_total 2",
		"flow_runs_waiting 0", "flow_runs_assigned 0", `flow_step_containment{mode="` + string(steps.Containment()) + `"} 1`,
		`flow_part_restarts_total{part="log-consumer"} 0`, `flow_part_healthy{part="log-consumer"} 1`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, body)
		}
	}
}

// The real binary: bad flags exit 2 with a one-line message; SIGTERM drains and exits 0.
func TestBinaryFlagsAndSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds flowd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "flowd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/flowrun/flow/cmd/flowd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--workers", "-3").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), "workers") {
		t.Fatalf("bad flag: %v %q", err, out)
	}
	cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-format", "json")
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "flowd ready") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("flowd did not get ready:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the child's log output
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(logs.String(), "flowd stopped") {
			t.Fatalf("exit %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("flowd did not stop on SIGTERM")
	}
}

// syncBuffer is a strings.Builder that a child process's output goroutine may write
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --nats-admin-creds, with --nats-url, gives the engine an admin's connection (its
// admin path over flow's streams: docs/security.md, "Sealing and repair"); without it
// there is none.
func TestNATSAdminCredsGivesAnAdminPath(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "admin.creds")
	if err := os.WriteFile(creds, []byte("not read until the connection is made\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--nats-url", "nats://127.0.0.1:4222", "--nats-admin-creds", creds}, nil)
	if err != nil || c.NATSAdminCreds != creds || len(c.natsAdminOptions()) != 1 {
		t.Fatalf("with --nats-admin-creds: %+v %v", c, err)
	}
	c, err = Load([]string{"--nats-url", "nats://127.0.0.1:4222"}, nil)
	if err != nil || c.natsAdminOptions() != nil {
		t.Fatalf("without: %v %v", c.natsAdminOptions(), err)
	}
}
