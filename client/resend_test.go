package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/resend"
)

// serve serves n's API again (after n.srv.Stop).
func serve(t *testing.T, n *node) {
	t.Helper()
	srv, err := apiserver.Serve(apiserver.Config{Node: n.e.API()})
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
	t.Cleanup(srv.Stop)
}

// swallow is a node that dies with the next request in hand: it stops n's API server
// and takes its place in the API's queue group, the only member; the next request
// reaches it, act does what the dying node did with it (nil: nothing), then n serves
// again and the hole leaves, before the request's try ends. Nothing answers it, as
// when NATS hands a request to a node SIGKILLed a moment before. The request (with its
// headers) is sent on the channel.
func swallow(t *testing.T, n *node, act func(*nats.Msg)) <-chan *nats.Msg {
	t.Helper()
	n.srv.Stop()
	nc, err := nats.Connect(n.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan *nats.Msg, 1)
	var sub *nats.Subscription
	sub, err = nc.QueueSubscribe(client.Subject+".>", "flow-api", func(m *nats.Msg) {
		if act != nil {
			act(m)
		}
		serve(t, n)
		_ = sub.Unsubscribe()
		_ = nc.Flush()
		got <- m
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return got
}

// startAsTheDyingNodeDid starts the run the request asks for, on n, as n's API server
// would have (the request's try and nonce from its headers).
func startAsTheDyingNodeDid(t *testing.T, n *node, inputs map[string]string) func(*nats.Msg) {
	return func(m *nats.Msg) {
		var req client.Request
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Error(err)
			return
		}
		if inputs != nil {
			req.Inputs = inputs // someone else's start of the same ID
		}
		ctx := resend.WithTry(audit.WithActor(context.Background(), ""), resend.Parse(m.Header.Get(resend.HeaderNonce), m.Header.Get(resend.HeaderTry)))
		if _, err := n.e.API().StartRun(ctx, req.Workflow, client.StartOptions{ID: req.ID, Inputs: req.Inputs}); err != nil {
			t.Errorf("the dying node's start: %v", err)
		}
	}
}

func received(t *testing.T, got <-chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("the hole got no request within 30s")
		return nil
	}
}

// A try that goes unanswered (NATS handed it to a node that died with it) is sent again
// when that is safe: a read, a run.wait, a run.start. A start whose first try the dying
// node carried out is one run, whose ID the second try gets, with or without an ID given
// (the ID is fixed before the first try: derived from a nonce when not given). A start
// of an ID that someone else's start took with other inputs is the conflict it always
// was; a cancel, which is not sent again, waits for its answer until the call's time is
// up. Before resending (stop 34's CI and its predecessors), the start and the wait here
// failed as ErrUnreachable after the call's whole timeout.
func TestUnansweredTriesAreSentAgain(t *testing.T) {
	n := startNode(t)
	// Each call has 10 s: without resending, the start waits them out (ErrUnreachable).
	c := dial(t, n.url, client.WithAttemptTimeout(200*time.Millisecond), client.WithTimeout(10*time.Second))
	ctx := ctxT(t, 60*time.Second)
	apply(t, c, "quick.yaml", wfQuick)
	count := func() int {
		runs, err := c.Runs(ctx, client.ListOptions{Workflow: "quick"})
		if err != nil {
			t.Fatal(err)
		}
		return len(runs)
	}

	got := swallow(t, n, startAsTheDyingNodeDid(t, n, nil))
	id, err := c.StartRun(ctx, "quick", client.StartOptions{})
	first := received(t, got)
	if err != nil || count() != 1 {
		t.Fatalf("a start without an ID whose first try a dying node carried out: %q %v, %d runs; want its ID and one run", id, err, count())
	}
	if nonce := first.Header.Get(resend.HeaderNonce); !resend.Derived(id, nonce) || first.Header.Get(resend.HeaderTry) != "" {
		t.Fatalf("the first try: ID %q, nonce %q, try %q; want an ID derived from the nonce, and no try header", id, nonce, first.Header.Get(resend.HeaderTry))
	}

	got = swallow(t, n, startAsTheDyingNodeDid(t, n, nil))
	id, err = c.StartRun(ctx, "quick", client.StartOptions{ID: "given-1", Inputs: map[string]string{"n": "2"}})
	received(t, got)
	if err != nil || id != "given-1" || count() != 2 {
		t.Fatalf("a start of a given ID whose first try a dying node carried out: %q %v, %d runs", id, err, count())
	}

	got = swallow(t, n, nil)
	id, err = c.StartRun(ctx, "quick", client.StartOptions{ID: "given-2"})
	received(t, got)
	if err != nil || id != "given-2" || count() != 3 {
		t.Fatalf("a start whose first try was lost: %q %v, %d runs", id, err, count())
	}

	got = swallow(t, n, startAsTheDyingNodeDid(t, n, map[string]string{"n": "7"}))
	_, err = c.StartRun(ctx, "quick", client.StartOptions{ID: "given-3"})
	received(t, got)
	wantCode(t, err, client.CodeConflict, "a start sent again that finds another start's run of its ID")

	waitStatus(t, c, "given-1", "succeeded")
	got = swallow(t, n, nil)
	r, err := c.WaitRun(ctx, "given-1", 500*time.Millisecond)
	received(t, got)
	if err != nil || r.Status != "succeeded" {
		t.Fatalf("a wait whose first try was lost: %+v %v", r, err)
	}

	once := dial(t, n.url, client.WithAttemptTimeout(200*time.Millisecond), client.WithTimeout(2*time.Second))
	got = swallow(t, n, nil)
	_, err = once.CancelRun(ctx, "given-2")
	m := received(t, got)
	if !errors.Is(err, client.ErrUnreachable) || !strings.HasSuffix(m.Subject, ".run.cancel") {
		t.Fatalf("a cancel whose one try was lost: %v; want ErrUnreachable once the call's time is up", err)
	}
}
