package apiserver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/testkit/testnode"
)

// gateYAML parks twice: for the signal go, then for one operator's approval.
const gateYAML = `name: gate
steps:
  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}
  - {name: ok, uses: approval, needs: [w], with: {approvers: {role: operator, count: 1}, timeout: 1h}}
`

// startAuthEngine starts an engine with its scheduler and people: olga (operator) and
// vera (viewer).
func startAuthEngine(t *testing.T) *engine.Engine {
	t.Helper()
	return testnode.Engine(t, func(c *engine.Config) {
		c.NATSAuth = true
		c.NATSUsers = []engine.NATSUser{{Name: "olga", Password: "o-secret", Role: "operator"}, {Name: "vera", Password: "v-secret", Role: "viewer"}}
	})
}

func dialAs(t *testing.T, e *engine.Engine, user, password string) *client.Client {
	t.Helper()
	return dial(t, e, client.WithNATSOptions(nats.UserInfo(user, password)))
}

// waitUntil reads the run each time the node applies more of the log, until ok says
// it is as the test wants.
func waitUntil(t *testing.T, e *engine.Engine, id string, ok func(client.Run) bool) client.Run {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		changed := e.Changed()
		r, err := e.API().Run(id)
		if err == nil && ok(r) {
			return r
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("run %s never got there: %+v (%v)", id, r, err)
		}
	}
}

func waitingFor(kind string) func(client.Run) bool {
	return func(r client.Run) bool { return r.Status == "waiting" && r.Waiting != nil && r.Waiting.Kind == kind }
}

// A run parked on a wait wakes on an operator's signal (with its data and sender in the
// inbox, consumed by the wait step), parks again on its approval, and ends once an
// operator approves; run get's JSON carries the waiting block, started_by, the inbox and
// the decisions. A viewer may neither signal (NATS refuses the subject) nor approve (the
// engine refuses her role, as not authorized, with its reason); a step that is no
// approval step and a run that has ended are conflicts; data that is not JSON is a bad
// request that writes nothing. The API's counters count what it wrote.
func TestSignalAndApproveThroughTheAPI(t *testing.T) {
	e := startAuthEngine(t)
	s := serve(t, e)
	olga, vera := dialAs(t, e, "olga", "o-secret"), dialAs(t, e, "vera", "v-secret")
	ctx := ctxT(t, 60*time.Second)
	if _, err := olga.ApplyWorkflow(ctx, "gate.yaml", []byte(gateYAML)); err != nil {
		t.Fatal(err)
	}
	id, err := olga.StartRun(ctx, "gate", client.StartOptions{ID: "gate-1"})
	if err != nil {
		t.Fatal(err)
	}
	r := waitUntil(t, e, id, waitingFor(client.WaitSignal))
	if r.Waiting.Step != "w" || r.Waiting.Signal != "go" || r.Waiting.Until == nil || r.StartedBy != "olga" {
		t.Fatalf("waiting %+v, started by %q; want step w, signal go, an until, olga", *r.Waiting, r.StartedBy)
	}
	listed, err := vera.Runs(ctx, client.ListOptions{Status: "waiting"})
	if err != nil || len(listed) != 1 || listed[0].ID != id {
		t.Fatalf("run list --status waiting: %v, %v; want %s", listed, err, id)
	}

	if _, err := vera.Signal(ctx, id, "go", client.SignalOptions{}); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatalf("a viewer's signal: %v; want not authorized", err)
	}
	// Data that is not JSON never leaves the client, nor passes the server.
	if _, err := olga.Signal(ctx, id, "go", client.SignalOptions{Data: json.RawMessage(`{nope`)}); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("bad data: %v", err)
	}
	if _, err := s.runSignal(ctx, &client.Request{ID: id, Name: "go", Data: json.RawMessage(`{nope`)}); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("bad data at the server: %v", err)
	}
	if r, _ := e.API().Run(id); len(r.Inbox) != 0 {
		t.Fatalf("refused signals wrote %v", r.Inbox)
	}

	got, err := olga.Signal(ctx, id, "go", client.SignalOptions{Data: json.RawMessage(`{"x":1}`), ID: "k1"})
	if err != nil || got != (client.Signalled{ID: id, Signal: "go", SignalID: "k1"}) {
		t.Fatalf("signal: %+v, %v", got, err)
	}
	r = waitUntil(t, e, id, waitingFor(client.WaitApproval))
	if w := r.Waiting; w.Step != "ok" || w.Need != 1 || w.Role != "operator" || w.Until == nil {
		t.Fatalf("waiting %+v; want step ok, need 1, role operator, an until", *w)
	}
	if len(r.Inbox) != 1 || r.Inbox[0].Sender != "olga" || r.Inbox[0].ConsumedBy != "w" || r.Inbox[0].ID != "k1" || string(r.Inbox[0].Data) != `{"x":1}` {
		t.Fatalf("inbox %+v", r.Inbox)
	}

	_, err = vera.Approve(ctx, id, client.DecideOptions{Comment: "me too"})
	var ce *client.Error
	if !errors.Is(err, client.ErrNotAuthorized) || !errors.As(err, &ce) || ce.Code != client.CodeForbidden || !strings.Contains(err.Error(), "needs operator") {
		t.Fatalf("a viewer's approval: %v; want forbidden, saying the step needs operator", err)
	}
	if _, err := olga.Approve(ctx, id, client.DecideOptions{Step: "w"}); !errors.As(err, &ce) || ce.Code != client.CodeConflict || !strings.Contains(err.Error(), `no approval step "w"`) {
		t.Fatalf("approving a step that is no approval step: %v; want a conflict", err)
	}
	d, err := olga.Approve(ctx, id, client.DecideOptions{Comment: "ship it"})
	if err != nil || d != (client.Decided{ID: id, Step: "ok", Decision: "approve"}) {
		t.Fatalf("approve: %+v, %v", d, err)
	}
	end, err := olga.WaitRun(ctx, id, 30*time.Second)
	if err != nil || end.Status != "succeeded" {
		t.Fatalf("the run ended %s (%v); want succeeded", end.Status, err)
	}
	if end.Waiting != nil || len(end.Decisions) != 1 || end.Decisions[0].Actor != "olga" || !end.Decisions[0].Approve || end.Decisions[0].Comment != "ship it" {
		t.Fatalf("waiting %+v, decisions %+v", end.Waiting, end.Decisions)
	}

	if _, err := olga.Signal(ctx, id, "go", client.SignalOptions{}); !errors.As(err, &ce) || ce.Code != client.CodeConflict || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("signalling an ended run: %v; want a conflict saying it has ended", err)
	}
	if _, err := olga.Reject(ctx, id, client.DecideOptions{}); !errors.As(err, &ce) || ce.Code != client.CodeConflict {
		t.Fatalf("rejecting on an ended run: %v; want a conflict", err)
	}
	if c := s.Counts(); c != (Counts{Signals: 1, Approvals: 1}) {
		t.Fatalf("counts %+v; want one signal, one approval", c)
	}

	// The history shows who signalled and decided, with the entries' detail.
	evs, err := vera.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, ev := range evs {
		switch ev.Kind {
		case "signal", "decide":
			if ev.Actor != "olga" || ev.Detail == "" {
				t.Errorf("event %+v: want olga as actor and a detail", ev)
			}
			fallthrough
		case "park":
			kinds = append(kinds, ev.Kind)
		}
	}
	if strings.Join(kinds, " ") != "park signal park decide" {
		t.Errorf("history's waits: %v", kinds)
	}
}

// A rejection fails the approval step, and the run.
func TestRejectFailsTheRun(t *testing.T) {
	e := startAuthEngine(t)
	s := serve(t, e)
	olga := dialAs(t, e, "olga", "o-secret")
	ctx := ctxT(t, 60*time.Second)
	if _, err := olga.ApplyWorkflow(ctx, "gate.yaml", []byte(gateYAML)); err != nil {
		t.Fatal(err)
	}
	id, err := olga.StartRun(ctx, "gate", client.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, e, id, waitingFor(client.WaitSignal))
	if _, err := olga.Signal(ctx, id, "go", client.SignalOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, e, id, waitingFor(client.WaitApproval))
	d, err := olga.Reject(ctx, id, client.DecideOptions{Step: "ok", Comment: "not today"})
	if err != nil || d.Decision != "reject" || d.Step != "ok" {
		t.Fatalf("reject: %+v, %v", d, err)
	}
	end, err := olga.WaitRun(ctx, id, 30*time.Second)
	if err != nil || end.Status != "failed" || end.FailedStep != "ok" {
		t.Fatalf("the run ended %s in %q (%v); want failed in ok", end.Status, end.FailedStep, err)
	}
	if c := s.Counts(); c != (Counts{Signals: 1, Rejections: 1}) {
		t.Fatalf("counts %+v", c)
	}
}

// Without --auth the node names nobody: an approval is refused as not authorized,
// saying why, and nothing is written.
func TestApproveWithoutIdentityIsRefused(t *testing.T) {
	e := testnode.Engine(t, nil)
	serve(t, e)
	c := dial(t, e)
	ctx := ctxT(t, 60*time.Second)
	if _, err := c.ApplyWorkflow(ctx, "gate.yaml", []byte(gateYAML)); err != nil {
		t.Fatal(err)
	}
	id, err := c.StartRun(ctx, "gate", client.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Approve(ctx, id, client.DecideOptions{}); !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), "--auth") {
		t.Fatalf("an anonymous approval: %v; want not authorized, saying approvals need --auth", err)
	}
	if r, _ := e.API().Run(id); len(r.Decisions) != 0 {
		t.Fatalf("decisions %+v", r.Decisions)
	}
}
