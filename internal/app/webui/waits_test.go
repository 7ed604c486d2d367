package webui

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/testkit/testnode"
)

// startPeopleNode is startNode with the engine knowing its people (--auth) and the UI
// signing them in: otto (operator) and vera (viewer).
func startPeopleNode(t *testing.T) *testNode {
	t.Helper()
	e := testnode.Engine(t, func(c *engine.Config) {
		c.NATSAuth = true
		c.NATSUsers = []engine.NATSUser{{Name: "otto", Password: "o-pw", Role: client.RoleOperator}, {Name: "vera", Password: "v-pw", Role: client.RoleViewer}}
	})
	api, err := apiserver.Serve(apiserver.Config{Node: e.API()})
	if err != nil {
		t.Fatal(err)
	}
	ui, err := New(Config{Backend: api, SignIn: true, Users: []User{{Name: "otto", Password: "o-pw", Role: client.RoleOperator}, {Name: "vera", Password: "v-pw", Role: client.RoleViewer}}})
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{e: e, api: api, ui: ui, srv: httptest.NewServer(ui)}
	t.Cleanup(func() {
		ui.Close()
		n.srv.Close()
		api.Stop()
	})
	return n
}

// waitUntil reads the run each time the node applies more of the log until ok says it
// is as the test wants.
func (n *testNode) waitUntil(t *testing.T, id string, ok func(client.Run) bool) client.Run {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		changed := n.e.Changed()
		r, err := n.e.API().Run(id)
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

// The run page shows what a waiting run waits for and until when; an operator gets the
// signal form and sends a signal through it (data that is not JSON is refused, nothing
// sent); on the approval, a viewer gets the buttons but the engine refuses her (403,
// saying why), and the operator's approval (with its comment) ends the run. The runs
// list filters on waiting. A viewer's page has no signal form.
func TestRunPageWaitsSignalAndApproval(t *testing.T) {
	n := startPeopleNode(t)
	n.apply(t, "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}\n  - {name: ok, uses: approval, needs: [w], with: {approvers: {role: operator}}}\n")
	if _, err := n.e.StartRun(ctxT(t), "gate", nil, engine.RunOptions{ID: "g1"}); err != nil {
		t.Fatal(err)
	}
	n.waitUntil(t, "g1", func(r client.Run) bool { return r.Status == "waiting" })
	signIn := func(user, pw string) *http.Client {
		c := browser(t)
		if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {user}, "password": {pw}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
			t.Fatalf("%s's sign-in: %d", user, code)
		}
		return c
	}
	otto, vera := signIn("otto", "o-pw"), signIn("vera", "v-pw")

	_, page := get(t, otto, n.srv.URL+"/ui/runs/g1")
	if !strings.Contains(page, "for the signal <b>go</b>") || !strings.Contains(page, "until <time datetime=") || !strings.Contains(page, `action="/ui/runs/g1/signal"`) {
		t.Fatalf("an operator's page of a waiting run:\n%s", page)
	}
	if _, list := get(t, otto, n.srv.URL+"/ui/?status=waiting"); !strings.Contains(list, "g1") {
		t.Fatalf("the runs list filtered on waiting has no g1:\n%s", list)
	}
	if _, vpage := get(t, vera, n.srv.URL+"/ui/runs/g1"); strings.Contains(vpage, "/signal") {
		t.Fatalf("a viewer's page has the signal form")
	}
	signal := n.srv.URL + "/ui/runs/g1/signal"
	if code, body := post(t, otto, signal, url.Values{"csrf": {csrfOf(t, page)}, "name": {"go"}, "data": {"{nope"}}, nil); code != http.StatusBadRequest || !strings.Contains(body, "not valid JSON") {
		t.Fatalf("a signal with bad data: %d %s", code, body)
	}
	if r, _ := n.e.API().Run("g1"); len(r.Inbox) != 0 {
		t.Fatalf("bad data was sent: %+v", r.Inbox)
	}
	if code, _ := post(t, otto, signal, url.Values{"csrf": {csrfOf(t, page)}, "name": {"go"}, "data": {`{"ok": true}`}}, nil); code != http.StatusSeeOther {
		t.Fatalf("the signal: %d", code)
	}
	n.waitUntil(t, "g1", func(r client.Run) bool { return r.Waiting != nil && r.Waiting.Kind == client.WaitApproval })

	// A second signal: no step is left to take it; the page lists it as not yet taken.
	if code, _ := post(t, otto, signal, url.Values{"csrf": {csrfOf(t, page)}, "name": {"go"}, "data": {`{"again": true}`}}, nil); code != http.StatusSeeOther {
		t.Fatalf("the second signal: %d", code)
	}
	n.waitUntil(t, "g1", func(r client.Run) bool { return len(r.Inbox) == 2 })

	_, vpage := get(t, vera, n.srv.URL+"/ui/runs/g1")
	if !strings.Contains(vpage, `<a href="#step-ok" class="node s-waiting">`) {
		t.Fatalf("the graph does not draw the step the run waits on as waiting:\n%s", vpage)
	}
	if !strings.Contains(vpage, "<h2>Signals not yet taken</h2>") || !strings.Contains(vpage, "<b>go</b> from otto") || !strings.Contains(vpage, `in step <a href="#step-ok">ok</a>, since <time datetime="`) {
		t.Fatalf("the page of a run waiting for an approval lacks the signal not yet taken, or since when it waits:\n%s", vpage)
	}
	if !strings.Contains(vpage, `action="/ui/runs/g1/approve"`) || !strings.Contains(vpage, "/ui/runs/g1/reject") || !strings.Contains(vpage, "for 1 approval (operator or above): 0 of 1 so far") {
		t.Fatalf("the page of a run waiting for an approval:\n%s", vpage)
	}
	if code, body := post(t, vera, n.srv.URL+"/ui/runs/g1/approve", url.Values{"csrf": {csrfOf(t, vpage)}, "step": {"ok"}}, nil); code != http.StatusForbidden || !strings.Contains(body, "needs operator") {
		t.Fatalf("a viewer's approval: %d %s", code, body)
	}
	_, page = get(t, otto, n.srv.URL+"/ui/runs/g1")
	if code, _ := post(t, otto, n.srv.URL+"/ui/runs/g1/approve", url.Values{"csrf": {csrfOf(t, page)}, "step": {"ok"}, "comment": {"looks right"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("the operator's approval: %d", code)
	}
	r := n.waitUntil(t, "g1", client.Run.Terminal)
	if r.Status != "succeeded" || len(r.Decisions) != 1 || r.Decisions[0].Actor != "otto" || r.Decisions[0].Comment != "looks right" || r.Inbox[0].Sender != "otto" {
		t.Fatalf("the run ended %s, decisions %+v, inbox %+v", r.Status, r.Decisions, r.Inbox)
	}
}

// A run no live node can take for its runs_on is shown waiting for the label, with how to
// start such a node.
func TestRunPageWaitingForALabel(t *testing.T) {
	n := startPeopleNode(t)
	if err := n.e.Ops().WaitClusterVersion(ctxT(t), 3); err != nil {
		t.Fatal(err)
	}
	n.apply(t, "name: fin\nsteps:\n  - {name: transfer, uses: noop, runs_on: [finance]}\n")
	if _, err := n.e.StartRun(ctxT(t), "fin", nil, engine.RunOptions{ID: "f1"}); err != nil {
		t.Fatal(err)
	}
	n.waitUntil(t, "f1", func(r client.Run) bool { return r.Waiting != nil && r.Waiting.Kind == client.WaitLabel })
	c := browser(t)
	if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {"vera"}, "password": {"v-pw"}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", code)
	}
	if _, page := get(t, c, n.srv.URL+"/ui/runs/f1"); !strings.Contains(page, "for a node with the worker label <b>finance</b>") || !strings.Contains(page, "flowd --labels") {
		t.Fatalf("the page of a run waiting for a label:\n%s", page)
	}
}

// A run one of whose steps waits for a rate limit's moment is shown waiting for the rate,
// with the key and the step.
func TestRunPageWaitingForARate(t *testing.T) {
	n := startPeopleNode(t)
	if err := n.e.Ops().WaitClusterVersion(ctxT(t), 3); err != nil {
		t.Fatal(err)
	}
	n.apply(t, "name: paid\ninputs:\n  n: {type: list, default: [1, 2]}\nsteps:\n  - {name: pay, uses: noop, foreach: \"{{ inputs.n }}\", parallelism: 1, rate_limit: {key: wallet, limit: 1, per: 1h}}\n")
	if _, err := n.e.StartRun(ctxT(t), "paid", nil, engine.RunOptions{ID: "p1"}); err != nil {
		t.Fatal(err)
	}
	// The wait is seen from the node's report (every 5 s), not from a state change: poll.
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		r, err := n.e.API().Run("p1")
		if err == nil && r.Waiting != nil && r.Waiting.Kind == client.WaitRate {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("p1 never shown waiting for its rate: %+v %v", r, err)
		}
		<-tick.C
	}
	c := browser(t)
	if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {"vera"}, "password": {"v-pw"}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", code)
	}
	if _, page := get(t, c, n.srv.URL+"/ui/runs/p1"); !strings.Contains(page, "for the rate limit <b>wallet</b>: step pay waits") {
		t.Fatalf("the page of a run waiting for a rate:\n%s", page)
	}
	if err := n.e.Cancel(ctxT(t), "p1", "enough"); err != nil {
		t.Fatal(err)
	}
}
