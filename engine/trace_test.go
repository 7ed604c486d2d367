package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/tracing"
)

// recordSpans installs an in-memory exporter as flow's tracer provider for the test (the
// global one, as flowd's otlp.Setup installs it) and returns what it recorded.
func recordSpans(t *testing.T) func() []sdktrace.ReadOnlySpan {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	otel.SetTracerProvider(tp)
	was := tracing.SetEnabledTo(true)
	t.Cleanup(func() {
		tracing.SetEnabledTo(was)
		otel.SetTracerProvider(noop.NewTracerProvider())
		_ = tp.Shutdown(context.Background())
	})
	return sr.Ended
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.String()
		}
	}
	return ""
}

// Issue 38: the steps the engine carries out itself (a wait, an approval, a child
// workflow) have a flow.step span like an exec or http step's, one for each epoch that
// takes them up: the epoch that parks on it (outcome parked, with what it waits for)
// and the resumed one that completes it (succeeded).
func TestWaitApprovalAndChildStepsHaveSpans(t *testing.T) {
	ended := recordSpans(t)
	e := startEngine(t, func(c *Config) {
		c.NATSAuth = true
		c.NATSUsers = []NATSUser{{Name: "ann", Password: "pw-ann-1", Role: "operator"}, {Name: "bob", Password: "pw-bob-1", Role: "operator"}}
	})
	apply(t, e, "name: leaf\nsteps:\n  - {name: a, uses: noop}\n")
	apply(t, e, `
name: traced
steps:
  - {name: gate, uses: wait, with: {signal: go}}
  - {name: ok, needs: [gate], uses: approval, with: {approvers: {role: operator, count: 1}}}
  - {name: sub, needs: [ok], uses: workflow, with: {workflow: leaf}}
  - {name: after, needs: [sub], uses: noop}
`)
	ctx := ctxT(t, 60*time.Second)
	id, err := e.StartRun(audit.WithActor(ctx, "ann"), "traced", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting for its signal", isStatus(checkpoint.StatusWaiting))
	if err := e.Signal(ctx, id, "go", SignalOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting for an approval", func(r *checkpoint.Run) bool {
		return r.Status == checkpoint.StatusWaiting && r.Waiting.Kind == checkpoint.WaitApproval
	})
	if _, err := e.Decide(audit.WithActor(ctx, "bob"), id, "", true, ""); err != nil {
		t.Fatal(err)
	}
	if end, err := e.WaitRun(ctx, id); err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, end)
	}
	outcomes := map[string][]string{} // step -> the outcomes of its spans in this run
	for _, s := range ended() {
		if spanAttr(s, "flow.run.id") == id && spanAttr(s, "flow.step") != "" {
			step := spanAttr(s, "flow.step")
			outcomes[step] = append(outcomes[step], spanAttr(s, "flow.step.kind")+" "+spanAttr(s, "flow.step.outcome"))
		}
	}
	for step, want := range map[string][]string{
		"gate":  {"wait parked", "wait succeeded"},
		"ok":    {"approval parked", "approval succeeded"},
		"sub":   {"workflow parked", "workflow succeeded"},
		"after": {"noop succeeded"},
	} {
		if got := outcomes[step]; !slices.Equal(got, want) {
			t.Errorf("step %s's spans: %v; want %v", step, got, want)
		}
	}
	if t.Failed() {
		t.Logf("all the run's step spans: %s", fmt.Sprint(outcomes))
	}
}
