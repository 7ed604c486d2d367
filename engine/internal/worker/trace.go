package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/tracing"
	"github.com/flowrun/flow/workflow"
)

// Traces (internal/base/tracing; docs/operations.md, "Traces"): an epoch of a run is a
// span, a child of the run's submit span (its context is in the run, from the log), so
// every epoch on every node is in the run's one trace; each step attempt (and foreach
// item) is a span under it, whose context the step gets (an http step's traceparent
// header, an exec step's TRACEPARENT). The steps the engine carries out itself (a wait,
// an approval, a sleep that parks, a child workflow) get one span per epoch that takes
// them up (traced): the epoch that parks on one ends it "parked", the resumed one that
// completes it "succeeded". Fenced commits, a stolen epoch, a hand-back, a park and
// retries are events.

// startSpan starts the epoch's span under the run's trace and returns its context.
func (x *runExec) startSpan(ctx context.Context) context.Context {
	r := x.run
	if !tracing.Enabled() {
		// Nothing exported: no span, but a caller's trace context still reaches the
		// steps (and costs a W2 step nothing measurable).
		ctx = tracing.WithTraceparent(ctx, r.Trace)
		if r.Trace != "" {
			x.log = x.log.With("trace_id", tracing.TraceID(ctx))
		}
		return ctx
	}
	attrs := []attribute.KeyValue{
		attribute.String("flow.run.id", r.ID), attribute.String("flow.workflow", r.Workflow), attribute.Int("flow.workflow.version", r.Version),
		attribute.Int64("flow.epoch", x.epoch), attribute.String("flow.owner", x.p.cfg.Node), attribute.Int("flow.epoch_changes", r.EpochChanges),
	}
	var reason string
	var previous int64
	for i, ep := range r.Epochs {
		if ep.Epoch == x.epoch {
			reason = ep.Reason
			if i > 0 {
				previous = r.Epochs[i-1].Epoch
			}
		}
	}
	if reason != "" {
		attrs = append(attrs, attribute.String("flow.epoch.reason", reason))
	}
	ctx, x.span = tracing.Tracer().Start(tracing.WithTraceparent(ctx, r.Trace), "flow.run.epoch", trace.WithAttributes(attrs...))
	if previous > 0 {
		x.span.AddEvent("epoch changed", trace.WithAttributes(attribute.Int64("flow.epoch.previous", previous), attribute.String("flow.epoch.reason", reason)))
	}
	if id := tracing.TraceID(ctx); id != "" {
		x.log = x.log.With("trace_id", id)
	}
	return ctx
}

// endSpan ends the epoch's span with how the epoch ended.
func (x *runExec) endSpan(outcome string, err error) {
	if x.span == nil {
		return
	}
	x.span.SetAttributes(attribute.String("flow.epoch.outcome", outcome))
	if err != nil {
		x.span.SetStatus(codes.Error, err.Error())
	}
	x.span.End()
}

// spanEvent adds an event to the epoch's span.
func (x *runExec) spanEvent(name string, attrs ...attribute.KeyValue) {
	if x.span != nil {
		x.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// startStepSpan starts the span of a step attempt (or a foreach item's) under the
// epoch's.
func (x *runExec) startStepSpan(ctx context.Context, step, uses string, item, attempt int) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noSpan
	}
	attrs := []attribute.KeyValue{attribute.String("flow.run.id", x.run.ID), attribute.String("flow.step", step), attribute.String("flow.step.kind", uses),
		attribute.Int("flow.attempt", attempt), attribute.Int64("flow.epoch", x.epoch)}
	if item != checkpoint.ItemWhole {
		attrs = append(attrs, attribute.Int("flow.item", item))
	}
	return tracing.Tracer().Start(ctx, "flow.step "+step, trace.WithAttributes(attrs...))
}

// noSpan is the span of a step attempt when nothing is exported (its calls do nothing).
var noSpan = trace.SpanFromContext(context.Background())

// endStepSpan ends a step attempt's span with its outcome.
func endStepSpan(span trace.Span, err error, retrying bool) {
	if !span.IsRecording() {
		return
	}
	switch {
	case err == nil:
		span.SetAttributes(attribute.String("flow.step.outcome", "succeeded"))
	case retrying:
		span.SetAttributes(attribute.String("flow.step.outcome", "retrying"))
		span.AddEvent("retry", trace.WithAttributes(attribute.String("error", err.Error())))
		span.SetStatus(codes.Error, err.Error())
	default:
		span.SetAttributes(attribute.String("flow.step.outcome", "failed"))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// traced runs a step the engine carries out itself (run: a wait, an approval, a parking
// sleep, a child workflow) under a span like an attempt's: outcome succeeded, parked (an
// event says what it waits for), failed, or ended with the epoch.
func (x *runExec) traced(st *workflow.Step, run func() error) error {
	_, span := x.startStepSpan(x.ctx, st.Name, st.Uses, checkpoint.ItemWhole, 1)
	err := run()
	if !span.IsRecording() {
		return err
	}
	p := asPark(err)
	switch {
	case err == nil:
		span.SetAttributes(attribute.String("flow.step.outcome", "succeeded"))
	case p != nil:
		span.SetAttributes(attribute.String("flow.step.outcome", "parked"))
		attrs := []attribute.KeyValue{attribute.String("flow.wait.kind", p.wait.Kind)}
		if p.wait.Name != "" {
			attrs = append(attrs, attribute.String("flow.wait.signal", p.wait.Name))
		}
		if !p.wait.Until.IsZero() {
			attrs = append(attrs, attribute.String("flow.wait.until", p.wait.Until.UTC().Format(time.RFC3339)))
		}
		if len(p.wait.Children) > 0 {
			attrs = append(attrs, attribute.Int("flow.wait.children", len(p.wait.Children)))
		}
		span.AddEvent("parked", trace.WithAttributes(attrs...))
	case x.isStolen() || x.ctx.Err() != nil:
		span.SetAttributes(attribute.String("flow.step.outcome", "epoch-ended"))
		span.SetStatus(codes.Error, err.Error())
	default:
		span.SetAttributes(attribute.String("flow.step.outcome", "failed"))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}
