package steps

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flowrun/flow/internal/base/tracing"
)

// A step attempt's trace context reaches the step: an exec step's TRACEPARENT, an http
// step's traceparent header; without one, neither is set.
func TestStepsGetTheTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced := tracing.WithTraceparent(context.Background(), tp)
	for ctx, want := range map[context.Context]string{traced: tp, context.Background(): ""} {
		out, err := Exec{MaxOutput: 1 << 20}.Run(ctx, in(map[string]any{"command": list("sh", "-c", `printf '{"tp":"%s"}' "$TRACEPARENT"`)}))
		var o struct{ TP string }
		if err != nil || json.Unmarshal(out, &o) != nil || o.TP != want {
			t.Fatalf("exec step: %s %v; want TRACEPARENT %q", out, err, want)
		}
		var seen string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r.Header.Get("traceparent")
			w.Write([]byte(`{}`))
		}))
		if _, err := (HTTP{MaxOutput: 1 << 20}).Run(ctx, in(map[string]any{"url": srv.URL})); err != nil || seen != want {
			t.Fatalf("http step: traceparent %q (%v); want %q", seen, err, want)
		}
		srv.Close()
	}
	if err := tracing.ValidTraceparent("00-zz-00"); err == nil || !strings.Contains(err.Error(), "W3C") {
		t.Fatalf("a bad traceparent: %v", err)
	}
}
