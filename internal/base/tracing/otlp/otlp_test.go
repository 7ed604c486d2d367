package otlp

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/tracing"
	"github.com/flowrun/flow/internal/testkit/otlptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Nothing is exported unless the OTEL_* variables ask; what flow does not do is an
// error naming the variable.
func TestSetupFollowsTheStandardVariables(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	for _, off := range []map[string]string{{}, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}} {
		if shutdown, err := Setup(ctx, "flowd", env(off), log); shutdown != nil || err != nil {
			t.Fatalf("%v: an exporter (%v); want none", off, err)
		}
	}
	for v, bad := range map[string]map[string]string{
		"OTEL_TRACES_EXPORTER":        {"OTEL_TRACES_EXPORTER": "zipkin"},
		"OTEL_EXPORTER_OTLP_PROTOCOL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
	} {
		if _, err := Setup(ctx, "flowd", env(bad), log); err == nil || !strings.Contains(err.Error(), v) {
			t.Fatalf("%v: %v; want an error naming %s", bad, err, v)
		}
	}
}

// With an endpoint, spans go over OTLP/HTTP to a real receiver, with the service name,
// and a traceparent given in is the parent.
func TestSpansReachAnOTLPReceiver(t *testing.T) {
	rec := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rec.URL())
	shutdown, err := Setup(context.Background(), "flowd", env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL(), "OTEL_SERVICE_NAME": "flowd-test"}), slog.New(slog.DiscardHandler))
	if err != nil || shutdown == nil {
		t.Fatalf("setup: %v", err)
	}
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	_, span := tracing.Tracer().Start(tracing.WithTraceparent(context.Background(), parent), "flow.test")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rec.Spans("4bf92f3577b34da6a3ce929d0e0e4736")
	if len(spans) != 1 || spans[0].Name != "flow.test" || spans[0].ParentID != "00f067aa0ba902b7" || spans[0].Service != "flowd-test" {
		t.Fatalf("received %+v", rec.Spans(""))
	}
}
