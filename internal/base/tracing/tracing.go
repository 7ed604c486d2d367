// Package tracing is flow's OpenTelemetry tracing: its set-up from the standard OTEL_*
// environment variables (off when they say nothing), the tracer every part uses, and
// the W3C traceparent that carries a run's trace context through the log, into steps
// and in from callers (docs/operations.md, "Traces").
//
// Every part calls the global OpenTelemetry API: without an exporter installed
// (tracing/otlp.Setup, flowd's) it is a no-op that still
// carries a caller's trace context, so a run started with a traceparent passes it on to
// its steps even when this node exports nothing.
package tracing

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of flow's spans.
const Name = "github.com/flowrun/flow"

// Tracer is flow's tracer (the global provider's: a no-op until Setup).
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Enabled says whether an exporter was installed in this process (tracing/otlp.Setup).
func Enabled() bool { return enabled.Load() }

var enabled atomic.Bool

// SetEnabled records that an exporter was installed (for tracing/otlp.Setup).
func SetEnabled() { enabled.Store(true) }

// SetEnabledTo sets what Enabled says and returns what it said before: for a test that
// installs an in-memory exporter (go.opentelemetry.io/otel/sdk/trace/tracetest) as the
// global provider and puts things back at its end.
func SetEnabledTo(on bool) (was bool) { return enabled.Swap(on) }

// Traceparent is the W3C traceparent of the span in ctx ("" when it has none).
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// WithTraceparent returns ctx with the remote span context tp (a W3C traceparent) as its
// parent; ctx unchanged for "".
func WithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// ValidTraceparent checks a caller's traceparent ("" is valid: none), with an error
// that says the form.
func ValidTraceparent(tp string) error {
	if tp == "" {
		return nil
	}
	if !trace.SpanContextFromContext(WithTraceparent(context.Background(), tp)).IsValid() {
		return fmt.Errorf("traceparent %q: use the W3C form 00-<32 hex trace ID>-<16 hex span ID>-<2 hex flags>", tp)
	}
	return nil
}

// TraceID is the trace ID of the span in ctx ("" when it has none), for log lines.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// Inject writes ctx's trace context into HTTP-style headers (an http step's request).
func Inject(ctx context.Context, h propagation.TextMapCarrier) {
	propagation.TraceContext{}.Inject(ctx, h)
}
