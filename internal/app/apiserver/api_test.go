package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/testnode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver/apitest"
	"github.com/flowrun/flow/internal/base/testhooks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startEngine starts a real engine (embedded NATS on a free port, Pebble in a temp dir)
// without a scheduler: these tests write the scheduler's entries themselves when they
// need runs, and nothing else writes to the log.
func startEngine(t *testing.T) *engine.Engine {
	t.Helper()
	return testnode.Engine(t, func(c *engine.Config) { c.DisableScheduler = true })
}

// configFor serves e as flowd does: on its connection, supervised with its parts.
func configFor(e *engine.Engine) Config {
	return Config{Node: e.API()}
}

func serve(t *testing.T, e *engine.Engine) *Server {
	t.Helper()
	s, err := Serve(configFor(e))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func dial(t *testing.T, e *engine.Engine, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(e.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func connect(t *testing.T, e *engine.Engine) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The server checks every request before it reads anything: a request of another
// version is refused as a bad request that says to upgrade, and a request with a field
// the operation does not know is refused too (a typo must not be silently dropped).
//
// The requests reach the server's request path (wrap) through a service of the test's
// own on the same NATS server, answered on the subscription's goroutine: through the
// server's endpoints an error answer is written on another goroutine after the
// handler returned, a data race with nats.go micro (see
// TestErrorAnswersDoNotRaceWithMicro, skipped as a defect).
func TestServerRefusesOtherVersionsAndUnknownFields(t *testing.T) {
	e := startEngine(t)
	s := serve(t, e)
	checks, err := micro.AddService(hostConn(e), micro.Config{Name: "checks", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer checks.Stop()
	if err := checks.AddEndpoint("list", s.wrap(s.workflowList), micro.WithEndpointSubject("checks.workflow.list")); err != nil {
		t.Fatal(err)
	}
	if err := hostConn(e).Flush(); err != nil { // the server has the endpoint before the test asks
		t.Fatal(err)
	}
	nc := connect(t, e)
	ask := func(body string) (code, msg string, data []byte) {
		t.Helper()
		m, err := nc.Request("checks.workflow.list", []byte(body), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader), m.Data
	}
	for _, c := range []struct{ body, want string }{
		{`{"v":2}`, "request version 2; this server speaks version 1 (upgrade flowctl or flowd)"},
		{`{"v":0}`, "request version 0; this server speaks version 1 (upgrade flowctl or flowd)"},
		{`{}`, "request version 0"},
		{`{"v":1,"limt":5}`, `unknown field "limt"`},
		{`{"v":1,"inputs":{"a":"b"},"bogus":true}`, `unknown field "bogus"`},
		{`not json`, "the request is not valid JSON for this operation"},
	} {
		code, msg, _ := ask(c.body)
		if code != client.CodeBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%s: answered %q %q; want %s mentioning %q", c.body, code, msg, client.CodeBadRequest, c.want)
		}
	}
	// The control: the same operation at version 1 with known fields is answered.
	if code, msg, data := ask(`{"v":1,"limit":5}`); code != "" || string(data) != "[]" {
		t.Fatalf("a valid request: %q %q %s", code, msg, data)
	}
	// The client sends version 1 (and is answered by the server's own endpoint).
	if wfs, err := dial(t, e).Workflows(ctxT(t, 10*time.Second)); err != nil || len(wfs) != 0 {
		t.Fatalf("client call: %v %v", err, wfs)
	}
}

// Server.async answers a request on a goroutine of its own, after the micro handler has
// returned; nats.go micro's reqHandler reads the request's respondError (for the
// endpoint's stats) right then, and micro.Request.Error writes it: answered through it,
// every error answer was a data race (go test -race reported micro.(*service).reqHandler
// against micro.(*request).Error from api.(*Server).wrap, about 1 run in 3). The server
// now answers on the connection with micro's headers. This test sends bad requests to
// the server's own endpoint, under -race as CI runs it: it fails (a race report) if the
// answers go back through micro.Request.
func TestErrorAnswersDoNotRaceWithMicro(t *testing.T) {
	e := startEngine(t)
	serve(t, e)
	nc := connect(t, e)
	const n = 20
	for i := 0; i < n; i++ {
		m, err := nc.Request(client.Subject+".workflow.list", []byte(`{"v":2}`), 5*time.Second)
		if err != nil || m.Header.Get(micro.ErrorCodeHeader) != client.CodeBadRequest {
			t.Fatalf("bad request %d: %v", i, err)
		}
	}
}

// silent joins the API's queue group for op on its own connection and never answers:
// a paused node. It counts the requests it was given and closes first on the first.
type silent struct {
	got   atomic.Int32
	first chan struct{}
	sub   *nats.Subscription
}

func newSilent(t *testing.T, e *engine.Engine, op string) *silent {
	t.Helper()
	nc := connect(t, e)
	s := &silent{first: make(chan struct{})}
	sub, err := nc.QueueSubscribe(client.Subject+"."+op, "flow-api", func(*nats.Msg) {
		if s.got.Add(1) == 1 {
			close(s.first)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.sub = sub
	return s
}

// A read-only request first given to a node that never answers is tried again after
// AttemptTimeout, and another node answers it.
func TestClientRetriesReadOnlyCallsOnAnotherNode(t *testing.T) {
	e := startEngine(t)
	paused := newSilent(t, e, "workflow.list")
	const attempt = 3 * time.Second
	c := dial(t, e, client.WithTimeout(9*time.Second), client.WithAttemptTimeout(attempt))
	type result struct {
		wfs []client.Workflow
		err error
		d   time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		wfs, err := c.Workflows(context.Background())
		done <- result{wfs, err, time.Since(start)}
	}()
	// The paused node is the only member of the group: the first try is its.
	select {
	case <-paused.first:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the paused subscriber")
	}
	// A live node joins and the paused one leaves the group, before the try runs out:
	// only a retry can reach the live node.
	serve(t, e)
	if err := paused.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not return")
	}
	if r.err != nil || r.wfs == nil {
		t.Fatalf("read-only call after a silent node: %v %v", r.err, r.wfs)
	}
	if got := paused.got.Load(); got != 1 {
		t.Fatalf("the paused node got %d requests, want 1", got)
	}
	if r.d < attempt {
		t.Fatalf("answered after %s, before the first try ran out (%s): not a retry", r.d, attempt)
	}
}

// A request that changes state is sent once: a node that never answers it may still have
// done it, so the client does not send it again (to another node) but reports that no
// flowd answered. A read-only request to the same silent node is sent again and again.
func TestClientDoesNotRetryWrites(t *testing.T) {
	e := startEngine(t)
	apply := newSilent(t, e, "workflow.apply")
	list := newSilent(t, e, "workflow.list")
	const whole, attempt = 1500 * time.Millisecond, 200 * time.Millisecond
	c := dial(t, e, client.WithTimeout(whole), client.WithAttemptTimeout(attempt))
	_, err := c.ApplyWorkflow(context.Background(), "x.yaml", []byte("name: x\nsteps:\n  - name: a\n    uses: noop\n"))
	if !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("a write to a silent node: %v; want ErrUnreachable", err)
	}
	if got := apply.got.Load(); got != 1 {
		t.Fatalf("workflow.apply was sent %d times; want once", got)
	}
	// The control: the read-only operation is retried per AttemptTimeout.
	_, err = c.Workflows(context.Background())
	if !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("a read to a silent node: %v; want ErrUnreachable", err)
	}
	if got := list.got.Load(); got < 3 {
		t.Fatalf("workflow.list was sent %d times in %s at %s a try; want retries", got, whole, attempt)
	}
}

// Once Stop has begun, a request the subscription still delivers (one that was on its
// way while the registration went away) is answered "this node is stopping", not run.
// The test hands a real request to the stopped server's request path through a service
// of its own on the same NATS server; and, once stopped, the server answers nothing.
func TestStoppedServerAnswersStopping(t *testing.T) {
	e := startEngine(t)
	s, err := Serve(configFor(e))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, e, client.WithTimeout(5*time.Second))
	if _, err := c.Workflows(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("before Stop: %v", err)
	}
	s.Stop()
	// Stopped: no node serves the API any more.
	if _, err := c.Workflows(ctxT(t, 10*time.Second)); !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("after Stop: %v; want ErrUnreachable", err)
	}
	var ran atomic.Bool
	late, err := micro.AddService(hostConn(e), micro.Config{Name: "late", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Stop()
	h := s.async(s.wrap(func(context.Context, *client.Request) (any, error) { ran.Store(true); return "ran", nil }), s.slots, false)
	if err := late.AddEndpoint("late", h, micro.WithEndpointSubject(client.Subject+".cluster.status")); err != nil {
		t.Fatal(err)
	}
	if err := hostConn(e).Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = c.ClusterStatus(ctxT(t, 10*time.Second))
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != client.CodeInternal || !strings.Contains(ae.Message, "this node is stopping: try again (another node answers)") {
		t.Fatalf("a request delivered after Stop: %v; want %s \"this node is stopping\"", err, client.CodeInternal)
	}
	if ran.Load() {
		t.Fatal("the handler ran after Stop")
	}
}

// run.verify checks four invariants from the state. Three can be broken with real data
// on a store with a guard switched off (or, for the fourth, with none), and each is
// reported as a violation; a run written by the rules has none.
//
// "epochs only grow" cannot be broken with real data: an epoch is the sequence of its
// assign entry in the log, which only grows, and the store builds the epoch list from
// accepted assigns alone.
// "every accepted commit carried the run's epoch" needs the store's epoch check off;
// internal/app/cli's TestVerifyCatchesAStaleCommit covers it, and a store without the epoch
// check accepts the future-epoch commit used below, so it has an engine of its own there.
func TestRunVerifyReportsEachBrokenInvariant(t *testing.T) {
	e := startEngine(t)
	state := apitest.NewGuardsOff(t, &testhooks.Hooks{NoCheckpointCheck: true})
	s, err := Serve(Config{Node: apitest.Node{API: e.API(), State: state}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c := dial(t, e)
	ctx := ctxT(t, 30*time.Second)
	w := func(en checkpoint.Entry) (uint64, error) {
		seq, verdicts := state.Write(t, en)
		return seq, verdicts[0]
	}
	must := func(en checkpoint.Entry) int64 {
		t.Helper()
		seq, err := w(en)
		if err != nil {
			t.Fatalf("%s: %v", en.Kind, err)
		}
		return int64(seq)
	}
	// running writes a run of steps a and b that is running under one epoch, and
	// returns the epoch.
	running := func(id string) int64 {
		must(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Submit: &checkpoint.Submit{Workflow: "zz", Trigger: "manual",
			Steps: []checkpoint.StepSpec{{Name: "a"}, {Name: "b"}}}})
		ep := must(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: id, Term: 1 << 40})
		must(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: id, Epoch: ep, Owner: "w"})
		return ep
	}
	commit := func(id, step string, ep int64) error {
		_, err := w(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: id, Step: step, Item: checkpoint.ItemWhole, Epoch: ep, Owner: "w", Output: json.RawMessage(`{}`)})
		return err
	}
	verify := func(id string) client.Verification {
		t.Helper()
		v, err := c.Verify(ctx, id)
		if err != nil {
			t.Fatalf("run.verify %s: %v", id, err)
		}
		if len(v.Checked) != 4 || v.ID != id {
			t.Fatalf("run.verify %s: %+v", id, v)
		}
		return v
	}

	// By the rules: two epochs (a takeover), a fenced zombie commit, fresh commits.
	ep := running("clean")
	if err := commit("clean", "a", ep); err != nil {
		t.Fatal(err)
	}
	ep2 := must(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "clean", Epoch: ep, Term: 1 << 40})
	must(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "clean", Epoch: ep2, Owner: "w2"})
	if err := commit("clean", "b", ep); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("zombie commit: %v", err)
	}
	if err := commit("clean", "b", ep2); err != nil {
		t.Fatal(err)
	}
	if v := verify("clean"); !v.OK || len(v.Violations) != 0 {
		t.Fatalf("a run written by the rules: %+v", v)
	}

	// One accepted commit per step and item: with the checkpoint check off, a second
	// commit of step a is accepted, and verify says so.
	ep = running("twice")
	if err := commit("twice", "a", ep); err != nil {
		t.Fatal(err)
	}
	if err := commit("twice", "a", ep); err != nil {
		t.Fatalf("second commit with the checkpoint check off: %v", err)
	}
	if v := verify("twice"); v.OK || len(v.Violations) != 1 || !strings.Contains(v.Violations[0], "step a item -1 has two accepted commits") {
		t.Fatalf("two accepted commits of a step: %+v", v)
	}

	// Fenced commits carried an epoch no newer than the current one: a commit carrying
	// an epoch that was never assigned (newer than the run's) is fenced as unknown-epoch
	// by the store, and verify reports it.
	ep = running("future")
	if err := commit("future", "a", ep+1000); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a commit of a future epoch: %v; want fenced", err)
	}
	if v := verify("future"); v.OK || len(v.Violations) != 1 || !strings.Contains(v.Violations[0], "newer than the current") {
		t.Fatalf("a fenced commit of a newer epoch: %+v", v)
	}
}

// hostConn is the connection the node's API service is on (the tests register their
// own services beside it).
func hostConn(e *engine.Engine) *nats.Conn {
	nc, _, _ := e.API().Hosting()
	return nc
}
