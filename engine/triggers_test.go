package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// waitCond waits for cond, polling, up to d; it fails the test naming what.
func waitCond(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const closerYAML = `name: closer
inputs:
  date: {type: string}
on:
  - {subject: "ledger.closed.>", id: "ledger-{{ msg.data.ledger }}", inputs: {date: "{{ msg.data.date }}"}}
  - {subject: "ledger.approved.>", id: "ledger-{{ msg.data.ledger }}", signal: approved, inputs: {date: "{{ msg.data.date }}"}}
steps:
  - {name: approved, uses: wait, with: {signal: approved, timeout: 1m}}
  - {name: close, uses: noop, needs: [approved]}
`

// publishWhenCaptured publishes data on subject once FLOW_EVENTS captures it (the
// leader adds a trigger's subject within a refresh of the workflow's apply).
func publishWhenCaptured(t *testing.T, e *Engine, subject string, data string, msgID string) {
	t.Helper()
	js := e.js
	waitCond(t, 20*time.Second, "FLOW_EVENTS to capture "+subject, func() bool {
		s, err := js.Stream(ctxT(t, 5*time.Second), port.EventsStream)
		if err != nil {
			return false
		}
		return slices.ContainsFunc(s.CachedInfo().Config.Subjects, func(sub string) bool {
			return strings.HasPrefix(subject, strings.TrimSuffix(sub, ">"))
		})
	})
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	if msgID != "" {
		m.Header.Set("Nats-Msg-Id", msgID)
	}
	if _, err := js.PublishMsg(ctxT(t, 5*time.Second), m); err != nil {
		t.Fatal(err)
	}
}

func triggerCount(e *Engine, wf, outcome string) int64 {
	return e.Triggers().Messages[[2]string{wf, outcome}]
}

// A message on a trigger's subject starts a run whose ID and inputs it names, with
// trigger event; the same message again (published twice, without a header JetStream
// could de-duplicate by) starts nothing; one whose ID is not a run ID is refused and
// counted; a signal trigger signals the run its message names, starting it if need be.
func TestTriggers(t *testing.T) {
	e := startEngine(t, nil)
	if err := e.Ops().WaitClusterVersion(ctxT(t, 20*time.Second), checkpoint.LogFormatFlowControl); err != nil {
		t.Fatal(err)
	}
	apply(t, e, closerYAML)
	publishWhenCaptured(t, e, "ledger.closed.eu", `{"ledger":"l1","date":"2026-12-05"}`, "")
	waitCond(t, 20*time.Second, "run ledger-l1", func() bool { _, err := e.store.Run("ledger-l1"); return err == nil })
	r, _ := e.store.Run("ledger-l1")
	var in map[string]any
	_ = json.Unmarshal(r.Inputs, &in)
	if r.Trigger != checkpoint.TriggerEvent || in["date"] != "2026-12-05" || r.Workflow != "closer" {
		t.Fatalf("run ledger-l1: trigger %s, inputs %s, workflow %s", r.Trigger, r.Inputs, r.Workflow)
	}
	// Again, twice: JetStream keeps both (no Nats-Msg-Id), the run ID refuses them.
	publishWhenCaptured(t, e, "ledger.closed.eu", `{"ledger":"l1","date":"2026-12-06"}`, "")
	publishWhenCaptured(t, e, "ledger.closed.us", `{"ledger":"l1","date":"2026-12-05"}`, "")
	waitCond(t, 20*time.Second, "two messages seen", func() bool { return triggerCount(e, "closer", TriggerSeen) == 2 })
	// An ID that is no run ID, and data without the field the ID reads: refused.
	publishWhenCaptured(t, e, "ledger.closed.eu", `{"ledger":"a b","date":"2026-12-05"}`, "")
	publishWhenCaptured(t, e, "ledger.closed.eu", `closed`, "")
	waitCond(t, 20*time.Second, "two messages refused", func() bool { return triggerCount(e, "closer", TriggerRefused) == 2 })
	// The signal trigger: the run exists, so it is signalled, and goes on to succeed.
	publishWhenCaptured(t, e, "ledger.approved.eu", `{"ledger":"l1","date":"2026-12-05"}`, "m-1")
	ctx := ctxT(t, 30*time.Second)
	if _, err := e.WaitRun(ctx, "ledger-l1"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Run("ledger-l1"); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("ledger-l1 after its signal: %s", v.Run.Status)
	}
	// A signal trigger whose run does not exist starts it with the signal.
	publishWhenCaptured(t, e, "ledger.approved.eu", `{"ledger":"l2","date":"2026-12-07"}`, "m-2")
	waitCond(t, 20*time.Second, "run ledger-l2", func() bool { _, err := e.store.Run("ledger-l2"); return err == nil })
	if _, err := e.WaitRun(ctx, "ledger-l2"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Run("ledger-l2"); v.Run.Status != checkpoint.StatusSucceeded || v.Run.Trigger != checkpoint.TriggerEvent {
		t.Fatalf("ledger-l2: %s, trigger %s", v.Run.Status, v.Run.Trigger)
	}
	runs, _, err := e.QueryRuns(checkpoint.RunQuery{Trigger: checkpoint.TriggerEvent, Limit: 100})
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs with trigger event: %d %v", len(runs), err)
	}
	if got := triggerCount(e, "closer", TriggerStarted); got != 2 {
		t.Fatalf("started: %d, want 2 (ledger-l1, ledger-l2)", got)
	}
	// A consumer per trigger, each on the stream's subject the trigger names.
	s, err := e.js.Stream(ctxT(t, 5*time.Second), port.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range s.ConsumerNames(ctxT(t, 5*time.Second)).Name() {
		names = append(names, n)
	}
	if len(names) != 2 {
		t.Fatalf("consumers of FLOW_EVENTS: %v, want one per trigger", names)
	}
}

// The control: a trigger whose run ID is not the message's (the stream sequence added)
// starts a run for each delivery of one message.
func TestTriggersControlIDPerDelivery(t *testing.T) {
	h := new(testhooks.Hooks)
	h.TriggerIDPerDelivery.Store(true)
	e := startEngineWith(t, h, nil)
	if err := e.Ops().WaitClusterVersion(ctxT(t, 20*time.Second), checkpoint.LogFormatFlowControl); err != nil {
		t.Fatal(err)
	}
	apply(t, e, closerYAML)
	publishWhenCaptured(t, e, "ledger.closed.eu", `{"ledger":"l1","date":"2026-12-05"}`, "")
	publishWhenCaptured(t, e, "ledger.closed.eu", `{"ledger":"l1","date":"2026-12-05"}`, "")
	waitCond(t, 20*time.Second, "two runs of one ledger", func() bool {
		runs, err := e.store.RunsWithIDPrefix("ledger-l1", 10)
		return err == nil && len(runs) == 2
	})
}

// Below cluster version 3 a trigger starts nothing, and says why.
func TestTriggersWaitForTheClusterVersion(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.HoldClusterVersion = true })
	apply(t, e, closerYAML)
	waitCond(t, 20*time.Second, "the triggers' problem", func() bool {
		return strings.Contains(e.Triggers().Problem, "cluster version 3")
	})
	if _, err := e.js.Stream(context.Background(), port.EventsStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("FLOW_EVENTS below cluster version 3: %v, want none", err)
	}
}

// BenchmarkTriggerMessages: messages published on a trigger's subject until each has
// started its run (the submit applied), on one embedded node: the triggers part's
// throughput (docs/perf.md).
func BenchmarkTriggerMessages(b *testing.B) {
	e := startEngine(b, nil)
	if err := e.Ops().WaitClusterVersion(ctxT(b, 20*time.Second), checkpoint.LogFormatFlowControl); err != nil {
		b.Fatal(err)
	}
	apply(b, e, "name: bench\ninputs:\n  n: {type: int}\non: {subject: \"bench.>\", id: \"b-{{ msg.data.n }}\", inputs: {n: \"{{ msg.data.n }}\"}}\nsteps:\n  - {name: a, uses: noop}\n")
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := e.js.Stream(ctxT(b, 5*time.Second), port.EventsStream)
		if err == nil && slices.Contains(s.CachedInfo().Config.Subjects, "bench.>") {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("FLOW_EVENTS never captured bench.>")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.js.PublishAsync("bench.x", fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			b.Fatal(err)
		}
	}
	<-e.js.PublishAsyncComplete()
	for triggerCount(e, "bench", TriggerStarted) < int64(b.N) {
		if time.Now().After(deadline.Add(10 * time.Minute)) {
			b.Fatalf("started %d of %d", triggerCount(e, "bench", TriggerStarted), b.N)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "runs/s")
}
