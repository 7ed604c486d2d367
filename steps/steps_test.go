package steps

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func in(with map[string]any) Input {
	return Input{Run: "r1", Step: "s", Item: -1, Epoch: 42, Attempt: 1, IdempotencyKey: IdempotencyKey("r1", "s", -1), With: with}
}

func list(xs ...string) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func TestExecOutputsAndEnvironment(t *testing.T) {
	ctx := context.Background()
	x := Exec{MaxOutput: 1 << 20}
	out, err := x.Run(ctx, in(map[string]any{"command": list("sh", "-c", `printf '{"epoch":"%s","key":"%s","item":"%s","r":"%s"}' "$FLOW_EPOCH" "$FLOW_IDEMPOTENCY_KEY" "$FLOW_ITEM" "$REGION"`),
		"env": map[string]any{"REGION": "id"}}))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil || got["epoch"] != "42" || got["key"] != IdempotencyKey("r1", "s", -1) || got["item"] != "-1" || got["r"] != "id" {
		t.Fatalf("output %s (%v)", out, err)
	}
	out, err = x.Run(ctx, in(map[string]any{"command": list("echo", "hello")}))
	if err != nil || string(out) != `{"stdout":"hello"}` {
		t.Fatalf("plain stdout: %s %v", out, err)
	}
	_, err = x.Run(ctx, in(map[string]any{"command": list("sh", "-c", "echo oops >&2; exit 3")}))
	if err == nil || IsPermanent(err) || !strings.Contains(err.Error(), "oops") {
		t.Fatalf("failing command: %v; want a retryable error with its stderr", err)
	}
	_, err = x.Run(ctx, in(map[string]any{"command": list("/no/such/program")}))
	if !IsPermanent(err) {
		t.Fatalf("missing program: %v; want permanent", err)
	}
	_, err = x.Run(ctx, in(map[string]any{"command": "echo hi"}))
	if !IsPermanent(err) || !strings.Contains(err.Error(), "argv") {
		t.Fatalf("command as a string: %v", err)
	}
	small := Exec{MaxOutput: 10}
	_, err = small.Run(ctx, in(map[string]any{"command": list("sh", "-c", "yes | head -c 100")}))
	if !IsPermanent(err) || !strings.Contains(err.Error(), "more than 10 bytes") {
		t.Fatalf("large output: %v", err)
	}
}

// A command that ignores SIGTERM, and a child it started, are both gone once the step
// returns on timeout.
func TestExecTimeoutKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Exec{MaxOutput: 1 << 20}.Run(ctx, in(map[string]any{"command": list("sh", "-c",
		`trap '' TERM; (trap '' TERM; `+hostPid+` > `+pidFile+`; exec sleep 60) & while true; do sleep 0.05; done`)}))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the deadline", err)
	}
	if took := time.Since(start); took > KillGrace+2*time.Second {
		t.Fatalf("took %s", took)
	}
	pid := readPid(t, pidFile)
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(pid, 0) == nil { // the child is killed; it may take a moment to be reaped
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the step survived", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHTTPHeadersAndClassification(t *testing.T) {
	var seen http.Header
	var body map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		_ = json.NewDecoder(r.Body).Decode(&body)
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte(`{"credited":true}`))
		case "/busy":
			w.WriteHeader(503)
		case "/stale":
			w.WriteHeader(409)
			w.Write([]byte("epoch 41 < 42"))
		}
	}))
	defer srv.Close()
	h := HTTP{MaxOutput: 1 << 20}
	ctx := context.Background()
	out, err := h.Run(ctx, in(map[string]any{"url": srv.URL + "/ok", "body": map[string]any{"cents": float64(5)}}))
	if err != nil || string(out) != `{"credited":true}` {
		t.Fatalf("ok: %s %v", out, err)
	}
	if seen.Get("Flow-Run-Id") != "r1" || seen.Get("Flow-Epoch") != "42" || seen.Get("Idempotency-Key") != IdempotencyKey("r1", "s", -1) || body["cents"] != float64(5) {
		t.Fatalf("headers %v body %v", seen, body)
	}
	if _, err := h.Run(ctx, in(map[string]any{"url": srv.URL + "/busy"})); err == nil || IsPermanent(err) {
		t.Fatalf("503: %v; want retryable", err)
	}
	if _, err := h.Run(ctx, in(map[string]any{"url": srv.URL + "/stale", "method": "POST"})); !IsPermanent(err) || !strings.Contains(err.Error(), "409") {
		t.Fatalf("409: %v; want permanent", err)
	}
}

func TestSleepNoopRegistry(t *testing.T) {
	r := NewRegistry(0)
	s, _ := r.Get("sleep")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Run(ctx, in(map[string]any{"duration": "1h"})); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep: %v", err)
	}
	if _, err := s.Run(context.Background(), in(map[string]any{"duration": "soon"})); !IsPermanent(err) {
		t.Fatalf("bad duration: %v", err)
	}
	n, _ := r.Get("noop")
	if out, err := n.Run(context.Background(), in(map[string]any{"a": float64(1)})); err != nil || string(out) != `{"a":1}` {
		t.Fatalf("noop: %s %v", out, err)
	}
	if err := r.Register("exec", Func(noop)); err == nil {
		t.Fatal("registered exec twice")
	}
	if err := r.Register("Bad Kind", Func(noop)); err == nil {
		t.Fatal("registered a bad name")
	}
	if err := r.Register("payout", Func(noop)); err != nil || !r.Has("payout") {
		t.Fatalf("register: %v", err)
	}
	k1, k1again := IdempotencyKey("r", "s", 1), IdempotencyKey("r", "s", 1)
	if k1 != k1again || k1 == IdempotencyKey("r", "s", 2) || k1 == IdempotencyKey("r2", "s", 1) {
		t.Fatal("idempotency keys must be stable per (run, step, item) and differ between items")
	}
}
