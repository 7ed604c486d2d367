package leader

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/tracing"
)

// The leader's spans in a run's trace (internal/base/tracing): each epoch it gives (an
// assign, with the epoch it replaces and why) and a dead-lettering. An epoch whose
// owner died before it could export its own span is still named in the trace, by the
// assign that began it and the one that replaced it.

// traceAssign records an accepted assign of run r: epoch began, replacing previous.
func (t *termServices) traceAssign(r *checkpoint.Run, epoch, previous int64, reason string, at time.Time) {
	if !tracing.Enabled() || r.Trace == "" {
		return
	}
	if reason == "" {
		reason = checkpoint.ReasonAssigned
	}
	attrs := []attribute.KeyValue{attribute.String("flow.run.id", r.ID), attribute.String("flow.workflow", r.Workflow),
		attribute.Int64("flow.epoch", epoch), attribute.String("flow.epoch.reason", reason), attribute.Int64("flow.term", t.term.Term()),
		attribute.String("flow.leader", t.s.cfg.Node)}
	if previous > 0 {
		attrs = append(attrs, attribute.Int64("flow.epoch.previous", previous), attribute.String("flow.epoch.previous_owner", r.Owner))
	}
	_, span := tracing.Tracer().Start(tracing.WithTraceparent(context.Background(), r.Trace), "flow.run.assign",
		trace.WithTimestamp(at), trace.WithAttributes(attrs...))
	if previous > 0 {
		span.AddEvent("epoch changed", trace.WithAttributes(attribute.Int64("flow.epoch.previous", previous), attribute.String("flow.epoch.reason", reason)))
	}
	span.End()
}

// traceDeadLetter records run r's dead-lettering.
func traceDeadLetter(r *checkpoint.Run) {
	if !tracing.Enabled() || r.Trace == "" {
		return
	}
	_, span := tracing.Tracer().Start(tracing.WithTraceparent(context.Background(), r.Trace), "flow.run.dead_letter",
		trace.WithAttributes(attribute.String("flow.run.id", r.ID), attribute.String("flow.workflow", r.Workflow),
			attribute.Int64("flow.epoch", r.Epoch), attribute.Int("flow.epoch_changes", r.EpochChanges), attribute.Int("flow.max_epochs", r.MaxEpochs)))
	span.AddEvent("dead-lettered", trace.WithAttributes(attribute.String("reason", r.DeadLetter)))
	span.SetStatus(codes.Error, r.DeadLetter)
	span.End()
}
