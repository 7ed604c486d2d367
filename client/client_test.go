package client_test

// These tests use the client as its users do, against real parts only: an engine with
// its embedded NATS and Pebble on 127.0.0.1, and the API served on the engine's
// connection as flowd serves it. Every wait has a deadline and says what it waited for.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/testkit/forge"
	"github.com/flowrun/flow/internal/testkit/testnode"
)

// node is one flowd node: a real engine (it leads, schedules and runs steps) and the API
// served for it.
type node struct {
	e   *engine.Engine
	srv *apiserver.Server
	url string
}

func startNode(t *testing.T) *node {
	t.Helper()
	// The tests' hour-long sleeps hold a worker (a running run to cancel, to drain, to
	// see stolen), as they did before long sleeps parked their runs (issue 26).
	e := testnode.Engine(t, func(c *engine.Config) { c.ParkAfter = 24 * time.Hour })
	srv, err := apiserver.Serve(apiserver.Config{Node: e.API()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop) // before the engine stops (cleanups run last first)
	return &node{e: e, srv: srv, url: e.ClientURL()}
}

func dial(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor asks cond (every 10 ms) until it holds, for at most 20 s; cond says what it
// saw, for the failure message.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s; last seen: %s", what, seen)
		}
		<-tick.C // polling the server, with a deadline
	}
}

// wantCode fails unless err is the server's refusal with code (and a message).
func wantCode(t *testing.T, err error, code, what string) *client.Error {
	t.Helper()
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("%s: %v (%T); want a *client.Error with code %s", what, err, err, code)
	}
	if ae.Message == "" || ae.Error() != ae.Message {
		t.Fatalf("%s: error message %q, Error() %q", what, ae.Message, ae.Error())
	}
	if errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("%s: a refusal is also ErrUnreachable: %v", what, err)
	}
	return ae
}

func apply(t *testing.T, c *client.Client, file, yaml string) client.Workflow {
	t.Helper()
	w, err := c.ApplyWorkflow(ctxT(t, 20*time.Second), file, []byte(yaml))
	if err != nil {
		t.Fatalf("apply %s: %v", file, err)
	}
	return w
}

func start(t *testing.T, c *client.Client, workflow string, opts client.StartOptions) string {
	t.Helper()
	id, err := c.StartRun(ctxT(t, 20*time.Second), workflow, opts)
	if err != nil {
		t.Fatalf("start %s %+v: %v", workflow, opts, err)
	}
	return id
}

// waitRunning waits until the run is running with an epoch newer than after, and its
// step a has started, and returns it.
func waitRunning(t *testing.T, c *client.Client, id string, after int64) client.Run {
	t.Helper()
	var r client.Run
	waitFor(t, "run "+id+" running in an epoch after "+fmt.Sprint(after), func() (bool, string) {
		var err error
		r, err = c.Run(ctxT(t, 10*time.Second), id)
		return err == nil && r.Status == "running" && r.Epoch > after && len(r.Steps) > 0 && r.Steps[0].Status == "running",
			fmt.Sprintf("%s %v", r.Progress(), err)
	})
	return r
}

func waitStatus(t *testing.T, c *client.Client, id, status string) client.Run {
	t.Helper()
	var r client.Run
	waitFor(t, "run "+id+" "+status, func() (bool, string) {
		var err error
		r, err = c.Run(ctxT(t, 10*time.Second), id)
		return err == nil && r.Status == status, fmt.Sprintf("%s %v", r.Progress(), err)
	})
	return r
}

func ids(runs []client.Run) []string {
	out := []string{}
	for _, r := range runs {
		out = append(out, r.ID)
	}
	return out
}

const (
	wfV1  = "name: w\ndescription: first\nsteps:\n  - name: a\n    uses: noop\n"
	wfV2  = "name: w\ndescription: second\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    needs: [a]\n    uses: noop\n"
	wfBad = "name: bad\nsteps:\n  - name: a\n    uses: teleport\n"
	// nightly has a schedule that will not fire during the test (02:00 in Jakarta).
	wfNightly = "name: nightly\nschedule:\n  cron: \"0 2 * * *\"\n  timezone: Asia/Jakarta\nsteps:\n  - name: a\n    uses: noop\n"

	wfQuick = "name: quick\ninputs:\n  n: {type: int, default: 1}\nsteps:\n  - name: a\n    uses: noop\n    with: {n: \"{{ inputs.n }}\"}\n"
	// slow's two steps take long enough for a short wait to end first and for a watch
	// (every 200 ms) to see each step run.
	wfSlow = "name: slow\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 600ms}\n  - name: b\n    needs: [a]\n    uses: sleep\n    with: {duration: 600ms}\n"
	// hold runs until it is cancelled.
	wfHold = "name: hold\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n"
	wfFan  = "name: fan\nsteps:\n  - name: list\n    uses: noop\n    with: {items: [1, 2, 3]}\n  - name: each\n    needs: [list]\n    foreach: \"{{ steps.list.output.items }}\"\n    uses: noop\n    with: {x: \"{{ item }}\"}\n"
)

// Workflows: apply (an unchanged YAML keeps its version, a changed one makes the next),
// validate, list, show with the source, the server's refusals, and schedules.
func TestWorkflows(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 30*time.Second)

	w := apply(t, c, "w.yaml", wfV1)
	if w.Name != "w" || w.Version != 1 || w.Steps != 1 || w.Description != "first" || w.Schedule != "" {
		t.Fatalf("first apply: %+v", w)
	}
	if w := apply(t, c, "w.yaml", wfV1); w.Version != 1 {
		t.Fatalf("the same YAML again: version %d, want 1", w.Version)
	}
	if w := apply(t, c, "w.yaml", wfV2); w.Name != "w" || w.Version != 2 || w.Steps != 2 || w.Description != "second" {
		t.Fatalf("a changed YAML: %+v, want version 2 of 2 steps", w)
	}

	// Validation refuses with the file's position, and applies nothing.
	_, err := c.ValidateWorkflow(ctx, "bad.yaml", []byte(wfBad))
	if ae := wantCode(t, err, client.CodeBadRequest, "validate a bad YAML"); !strings.Contains(ae.Message, `bad.yaml:4:11: step "a" uses unknown kind "teleport"`) {
		t.Fatalf("validate a bad YAML: %q; want the file, line and column of the unknown kind", ae.Message)
	}
	v, err := c.ValidateWorkflow(ctx, "v.yaml", []byte(strings.Replace(wfV2, "name: w", "name: v", 1)))
	if err != nil || v.Name != "v" || v.Steps != 2 {
		t.Fatalf("validate a good YAML: %+v %v", v, err)
	}
	_, err = c.ApplyWorkflow(ctx, "bad.yaml", []byte(wfBad))
	wantCode(t, err, client.CodeBadRequest, "apply a bad YAML")
	_, err = c.ApplyWorkflow(ctx, "empty.yaml", nil)
	wantCode(t, err, client.CodeBadRequest, "apply an empty file")

	ws, err := c.Workflows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range ws {
		got = append(got, fmt.Sprintf("%s@%d/%d", w.Name, w.Version, w.Steps))
		if _, err := time.Parse(time.RFC3339, w.AppliedAt); err != nil {
			t.Errorf("workflow %s@%d applied_at %q: %v", w.Name, w.Version, w.AppliedAt, err)
		}
		if w.Source != "" {
			t.Errorf("workflow list carries the source of %s@%d", w.Name, w.Version)
		}
	}
	// The server lists the latest version of each workflow (ops.go says "every workflow
	// version"): either way w@2 is listed, and neither the validated nor the refused ones.
	if !slices.Contains(got, "w@2/2") || slices.ContainsFunc(got, func(s string) bool { return !strings.HasPrefix(s, "w@") }) {
		t.Fatalf("workflows %v; want w at version 2 of 2 steps, and no other workflow", got)
	}

	shown, err := c.Workflow(ctx, "w")
	if err != nil || shown.Version != 2 || shown.Source != wfV2 || shown.Steps != 2 {
		t.Fatalf("workflow show w: %+v %v; want version 2 with its source", shown, err)
	}
	_, err = c.Workflow(ctx, "v")
	wantCode(t, err, client.CodeNotFound, "show a workflow only validated")
	_, err = c.Workflow(ctx, "")
	wantCode(t, err, client.CodeBadRequest, "show without a name")

	// Schedules: only the scheduled workflow, its next three fire times.
	if w := apply(t, c, "nightly.yaml", wfNightly); w.Schedule != "0 2 * * * Asia/Jakarta" {
		t.Fatalf("nightly's schedule: %q", w.Schedule)
	}
	before := time.Now()
	cs, err := c.Schedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 {
		t.Fatalf("schedules: %+v; want nightly alone", cs)
	}
	s := cs[0]
	if s.Workflow != "nightly" || s.Cron != "0 2 * * *" || s.Timezone != "Asia/Jakarta" || s.Overlap != "skip" || s.Catchup != "none" || len(s.Last) != 0 {
		t.Fatalf("schedule: %+v", s)
	}
	if len(s.Next) != 3 {
		t.Fatalf("schedule next: %v; want 3 times", s.Next)
	}
	var prev time.Time
	for i, at := range s.Next {
		tm, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatalf("next[%d] %q: %v", i, at, err)
		}
		if _, off := tm.Zone(); off != 7*3600 || tm.Hour() != 2 || tm.Minute() != 0 {
			t.Errorf("next[%d] %s: want 02:00 in Jakarta (+07:00)", i, at)
		}
		if i == 0 && (!tm.After(before) || tm.Sub(before) > 24*time.Hour) {
			t.Errorf("next[0] %s is not the next 02:00 in Jakarta after %s", at, before)
		}
		if i > 0 && tm.Sub(prev) != 24*time.Hour {
			t.Errorf("next[%d] %s is not a day after %s", i, at, prev)
		}
		prev = tm
	}
}

// A run's life through the typed methods: start (with and without an ID), get, list
// (filtered and paged), wait, watch, history, verify, cancel and retry.
func TestRuns(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 60*time.Second)
	for _, f := range []string{wfQuick, wfSlow, wfHold, wfFan} {
		apply(t, c, "f.yaml", f)
	}

	// The slow runs start first, so that they run while the rest is checked.
	s1 := start(t, c, "slow", client.StartOptions{})
	s2 := start(t, c, "slow", client.StartOptions{})
	if s1 == "" || s2 == "" || s1 == s2 {
		t.Fatalf("generated IDs %q %q", s1, s2)
	}
	var (
		watched   []client.Run
		watchEnd  client.Run
		watchErr  error
		watchDone = make(chan struct{})
	)
	go func() {
		defer close(watchDone)
		watchEnd, watchErr = c.WatchRun(ctx, s2, func(r client.Run) { watched = append(watched, r) })
	}()

	r, err := c.WaitRun(ctx, s1, 50*time.Millisecond)
	if err != nil || r.ID != s1 || r.Workflow != "slow" || r.Terminal() {
		t.Fatalf("a short wait on a slow run: %s %+v %v; want it as it is, not ended", r.Progress(), r, err)
	}

	// Start with and without an ID; the same ID again is a conflict.
	gen := start(t, c, "quick", client.StartOptions{Inputs: map[string]string{"n": "7"}})
	if gen == "" {
		t.Fatal("no ID generated")
	}
	if id := start(t, c, "quick", client.StartOptions{ID: "q-1"}); id != "q-1" {
		t.Fatalf("start with ID q-1 returned %q", id)
	}
	_, err = c.StartRun(ctx, "quick", client.StartOptions{ID: "q-1"})
	wantCode(t, err, client.CodeConflict, "a second start of q-1")
	_, err = c.StartRun(ctx, "nope", client.StartOptions{})
	wantCode(t, err, client.CodeBadRequest, "start an unknown workflow")
	_, err = c.StartRun(ctx, "quick", client.StartOptions{Inputs: map[string]string{"n": "seven"}})
	wantCode(t, err, client.CodeBadRequest, "start with an input of the wrong type")
	_, err = c.StartRun(ctx, "quick", client.StartOptions{ID: "a..b"})
	wantCode(t, err, client.CodeBadRequest, "start with an invalid ID")

	// A long wait returns the run ended, with its decoded steps, epochs and inputs.
	r, err = c.WaitRun(ctx, gen, 30*time.Second)
	if err != nil || !r.Terminal() || r.Status != "succeeded" {
		t.Fatalf("wait for %s: %s %v", gen, r.Progress(), err)
	}
	if r.ID != gen || r.Workflow != "quick" || r.Version != 1 || r.Trigger != "manual" || r.Epoch <= 0 || r.EpochChanges != 0 ||
		r.MaxEpochs != 5 || r.Owner != "" && r.Owner != "node-a" || string(r.Inputs) != `{"n":7}` {
		t.Fatalf("run %s: %+v", gen, r)
	}
	if len(r.Steps) != 1 || r.Steps[0].Name != "a" || r.Steps[0].Status != "succeeded" || r.Steps[0].Attempts != 1 ||
		r.Steps[0].Epoch != r.Epoch || string(r.Steps[0].Output) != `{"n":7}` {
		t.Fatalf("run %s steps: %+v", gen, r.Steps)
	}
	if len(r.Epochs) != 1 || r.Epochs[0].Epoch != r.Epoch || r.Epochs[0].Owner != "node-a" || r.Epochs[0].Reason != "assigned" || len(r.Fenced) != 0 {
		t.Fatalf("run %s epochs %+v fenced %+v", gen, r.Epochs, r.Fenced)
	}
	for _, at := range []string{r.CreatedAt, r.UpdatedAt, r.Epochs[0].At} {
		if _, err := time.Parse(time.RFC3339, at); err != nil {
			t.Fatalf("run %s time %q: %v", gen, at, err)
		}
	}
	got, err := c.Run(ctx, gen)
	if err != nil || got.ID != gen || got.Status != "succeeded" || got.Epoch != r.Epoch || len(got.Steps) != 1 {
		t.Fatalf("run get %s: %+v %v", gen, got, err)
	}
	_, err = c.Run(ctx, "nope")
	wantCode(t, err, client.CodeNotFound, "get an unknown run")
	_, err = c.Run(ctx, "a..b")
	wantCode(t, err, client.CodeBadRequest, "get an invalid ID")
	_, err = c.WaitRun(ctx, "nope", time.Second)
	wantCode(t, err, client.CodeNotFound, "wait for an unknown run")
	_, err = c.WaitRun(ctx, gen, 2*time.Minute)
	wantCode(t, err, client.CodeBadRequest, "wait longer than a minute")

	// A foreach step's items reach Run and Progress.
	fan := start(t, c, "fan", client.StartOptions{})
	if r, err := c.WaitRun(ctx, fan, 30*time.Second); err != nil || r.Status != "succeeded" || len(r.Steps) != 2 ||
		r.Steps[1].Items != 3 || r.Steps[1].ItemsDone != 3 || !strings.HasSuffix(r.Progress(), "list:succeeded each:succeeded(3/3)") {
		t.Fatalf("fan: %s %+v %v", r.Progress(), r.Steps, err)
	}

	// Lists: by workflow, by status, and paged with After.
	quick := []string{gen, "q-1"}
	for i := 2; i <= 5; i++ {
		quick = append(quick, start(t, c, "quick", client.StartOptions{ID: fmt.Sprintf("q-%d", i)}))
	}
	for _, id := range quick {
		if r, err := c.WaitRun(ctx, id, 30*time.Second); err != nil || r.Status != "succeeded" {
			t.Fatalf("wait for %s: %s %v", id, r.Progress(), err)
		}
	}
	slices.Sort(quick)
	runs, err := c.Runs(ctx, client.ListOptions{Workflow: "quick"})
	if got := ids(runs); err != nil || !slices.Equal(sorted(got), quick) {
		t.Fatalf("runs of quick: %v %v; want %v", got, err, quick)
	}
	for _, r := range runs {
		if r.Workflow != "quick" || r.Status != "succeeded" || len(r.Steps) != 0 {
			t.Fatalf("listed run %+v; want quick, succeeded, without steps", r)
		}
	}
	runs, err = c.Runs(ctx, client.ListOptions{Workflow: "quick", Status: "succeeded"})
	if got := ids(runs); err != nil || !slices.Equal(sorted(got), quick) {
		t.Fatalf("succeeded runs of quick: %v %v; want %v", got, err, quick)
	}
	if runs, err := c.Runs(ctx, client.ListOptions{Workflow: "quick", Status: "failed"}); err != nil || len(runs) != 0 {
		t.Fatalf("failed runs of quick: %v %v; want none", ids(runs), err)
	}
	if runs, err := c.Runs(ctx, client.ListOptions{Workflow: "nope"}); err != nil || len(runs) != 0 {
		t.Fatalf("runs of an unknown workflow: %v %v; want none", ids(runs), err)
	}
	all, err := c.Runs(ctx, client.ListOptions{})
	if err != nil || len(all) != len(quick)+3 { // and s1, s2, fan
		t.Fatalf("every run: %v %v", ids(all), err)
	}
	// (Every run, whatever its status: the slow ones may end meanwhile.)
	for _, o := range []client.ListOptions{{Workflow: "quick"}, {Workflow: "quick", Status: "succeeded"}, {}} {
		o.Limit = 2
		var paged []string
		for page := 0; ; page++ {
			p, err := c.RunsPage(ctx, o)
			if err != nil || len(p.Runs) > 2 || page > 10 {
				t.Fatalf("page %d of %+v: %v %v", page, o, ids(p.Runs), err)
			}
			for _, id := range ids(p.Runs) {
				if slices.Contains(paged, id) {
					t.Fatalf("page %d of %+v repeats %s (pages so far %v)", page, o, id, paged)
				}
				paged = append(paged, id)
			}
			if p.Next == "" {
				break
			}
			o.After = p.Next
		}
		o.After, o.Limit = "", 0
		whole, err := c.Runs(ctx, o)
		if err != nil || !slices.Equal(paged, ids(whole)) {
			t.Fatalf("paged by 2, %+v gives %v; in one page %v %v", o, paged, ids(whole), err)
		}
	}
	_, err = c.Runs(ctx, client.ListOptions{Status: "runing"})
	wantCode(t, err, client.CodeBadRequest, "list by an unknown status")
	_, err = c.Runs(ctx, client.ListOptions{Limit: -1})
	wantCode(t, err, client.CodeBadRequest, "list with a negative limit")

	// The slow runs end; the watch saw their steps change.
	r, err = c.WaitRun(ctx, s1, 30*time.Second)
	if err != nil || !r.Terminal() || r.Status != "succeeded" {
		t.Fatalf("a long wait on a slow run: %s %v", r.Progress(), err)
	}
	select {
	case <-watchDone:
	case <-ctx.Done():
		t.Fatal("the watch did not return")
	}
	if watchErr != nil || !watchEnd.Terminal() || watchEnd.Status != "succeeded" || watchEnd.ID != s2 {
		t.Fatalf("watch %s ended with %s %v", s2, watchEnd.Progress(), watchErr)
	}
	var lines []string
	for _, r := range watched {
		lines = append(lines, r.Progress())
	}
	if len(watched) < 3 || watched[0].Terminal() || !watched[len(watched)-1].Terminal() || lines[len(lines)-1] != watchEnd.Progress() {
		t.Fatalf("the watch saw %q; want at least 3 lines, the last one the end", lines)
	}
	for i := 1; i < len(lines); i++ {
		if lines[i] == lines[i-1] {
			t.Fatalf("the watch called back twice with %q: %q", lines[i], lines)
		}
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasSuffix(l, "a:succeeded b:running") }) ||
		!strings.HasPrefix(lines[len(lines)-1], "succeeded epoch ") || !strings.HasSuffix(lines[len(lines)-1], " (changes 0) a:succeeded b:succeeded") {
		t.Fatalf("the watch saw %q; want step b running after a succeeded, then the run succeeded", lines)
	}

	// History and verify of a finished run.
	evs, err := c.History(ctx, s1)
	if err != nil || len(evs) == 0 {
		t.Fatalf("history %s: %v %v", s1, evs, err)
	}
	var kinds, commits []string
	for i, e := range evs {
		kinds = append(kinds, e.Kind)
		if i > 0 && e.Seq < evs[i-1].Seq { // entries of one log message share its sequence
			t.Fatalf("history %s: seq %d after %d", s1, e.Seq, evs[i-1].Seq)
		}
		if e.Kind == "commit" {
			commits = append(commits, e.Step)
			if e.Outcome != "accepted" || e.Epoch != r.Epoch || e.Owner != "node-a" {
				t.Fatalf("history %s: commit %+v; want accepted in epoch %d by node-a", s1, e, r.Epoch)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, e.At); err != nil {
			t.Fatalf("history %s: event time %q: %v", s1, e.At, err)
		}
	}
	if kinds[0] != "submit" || kinds[len(kinds)-1] != "complete" || !slices.Contains(kinds, "assign") || !slices.Equal(commits, []string{"a", "b"}) {
		t.Fatalf("history %s: kinds %v, commits %v", s1, kinds, commits)
	}
	_, err = c.History(ctx, "nope")
	wantCode(t, err, client.CodeNotFound, "history of an unknown run")
	ver, err := c.Verify(ctx, s1)
	if err != nil || !ver.OK || ver.ID != s1 || len(ver.Checked) != 4 || len(ver.Violations) != 0 {
		t.Fatalf("verify %s: %+v %v", s1, ver, err)
	}
	_, err = c.Verify(ctx, "nope")
	wantCode(t, err, client.CodeNotFound, "verify an unknown run")

	// Cancel a running run, retry it: it runs again in a new epoch.
	h := start(t, c, "hold", client.StartOptions{ID: "h-1"})
	running := waitRunning(t, c, h, 0)
	runs, err = c.Runs(ctx, client.ListOptions{Status: "running"})
	if err != nil || !slices.Equal(ids(runs), []string{h}) {
		t.Fatalf("running runs: %v %v; want %s alone", ids(runs), err, h)
	}
	_, err = c.RetryRun(ctx, h)
	wantCode(t, err, client.CodeConflict, "retry a running run")
	ch, err := c.CancelRun(ctx, h)
	if err != nil || ch != (client.Change{ID: h, Status: "cancelled"}) {
		t.Fatalf("cancel %s: %+v %v", h, ch, err)
	}
	if r, err := c.Run(ctx, h); err != nil || r.Status != "cancelled" || !r.Terminal() {
		t.Fatalf("after cancel: %s %v", r.Progress(), err)
	}
	_, err = c.CancelRun(ctx, h)
	wantCode(t, err, client.CodeConflict, "cancel a cancelled run")
	_, err = c.CancelRun(ctx, gen)
	wantCode(t, err, client.CodeConflict, "cancel a succeeded run")
	ch, err = c.RetryRun(ctx, h)
	if err != nil || ch != (client.Change{ID: h, Status: "pending"}) {
		t.Fatalf("retry %s: %+v %v", h, ch, err)
	}
	again := waitRunning(t, c, h, running.Epoch)
	if last := again.Epochs[len(again.Epochs)-1]; last.Reason != "retried" || last.Epoch != again.Epoch || again.EpochChanges != 0 {
		t.Fatalf("after retry: epochs %+v, changes %d; want a new epoch, retried, not counted", again.Epochs, again.EpochChanges)
	}
	if ch, err := c.CancelRun(ctx, h); err != nil || ch.Status != "cancelled" {
		t.Fatalf("cancel %s again: %+v %v", h, ch, err)
	}
	_, err = c.RetryRun(ctx, "nope")
	wantCode(t, err, client.CodeNotFound, "retry an unknown run")
	_, err = c.CancelRun(ctx, "")
	wantCode(t, err, client.CodeBadRequest, "cancel without an ID")
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestClusterStatus(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 30*time.Second)
	apply(t, c, "w.yaml", wfV1) // something applied
	// The cluster's leader (the key's holder) and the node's own answer are read apart:
	// on a busy machine the node's election part may be restarting while it still holds
	// the key (a fresh-clone CI run with busy loops saw "election: starting"), so both
	// are waited for.
	var st client.ClusterStatus
	waitFor(t, "node-a to lead, and to say so", func() (bool, string) {
		var err error
		st, err = c.ClusterStatus(ctx)
		return err == nil && st.Leader == "node-a" && len(st.Nodes) == 1 && st.Nodes[0].Leader, fmt.Sprintf("%+v %v", st, err)
	})
	if st.Term <= 0 {
		t.Fatalf("cluster status %+v; want a term", st)
	}
	if nd := st.Nodes[0]; nd.ID != "node-a" || nd.Applied == 0 {
		t.Fatalf("node %+v; want node-a, with entries applied", nd)
	}
}

// The zombie drill through the client: the paused worker's commit fenced, and verify ok.
func TestDrillZombie(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	d, err := c.DrillZombie(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d.Run.Workflow != "flow-drill-zombie" || d.Run.Status != "succeeded" || len(d.Run.Epochs) < 2 || d.Run.EpochChanges < 1 {
		t.Fatalf("drill run: %s %+v", d.Run.Progress(), d.Run.Epochs)
	}
	if len(d.Run.Fenced) == 0 {
		t.Fatal("drill: no fenced commit")
	}
	if f := d.Run.Fenced[0]; f.Step != "pause" || f.Owner != "node-a" || f.Epoch >= f.CurrentEpoch || f.Reason == "" {
		t.Fatalf("drill: fenced %+v; want node-a's commit of pause in an older epoch", f)
	}
	if !d.Verify.OK || d.Verify.ID != d.Run.ID || len(d.Verify.Violations) != 0 {
		t.Fatalf("drill verify: %+v", d.Verify)
	}
}

// loseOwner makes a running run lose its owner twice, as the leader sees a node that
// dies: an assign as the reclaim of a lapsed lease (a counted epoch change), claimed by
// an owner that holds no lease and never runs it. The leader reclaims that one too: a
// second counted change, more than max_epochs 1, so the run goes to the DLQ.
// (internal/app/cli's TestDeadLetterQueue does the same.)
func loseOwner(t *testing.T, n *node, r client.Run) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	leader, err := n.e.Leader(ctx)
	if err != nil || leader.Node != n.e.NodeID() {
		t.Fatalf("node-a does not lead (%+v, %v), yet it ran a run", leader, err)
	}
	w := forge.Open(t, n.url)
	assign, err := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: r.ID, Epoch: r.Epoch, Term: leader.Term,
		Owner: "test", Reason: checkpoint.ReasonLeaseExpired})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: r.ID, Epoch: int64(assign), Owner: "ghost"}); err != nil {
		t.Fatal(err)
	}
	if err := n.e.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := n.e.Run(r.ID); err != nil || v.Run.Epoch < int64(assign) {
		t.Fatalf("the forged assign at %d was not accepted: %+v %v", assign, v, err)
	}
}

func TestDeadLetterQueue(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 60*time.Second)
	apply(t, c, "stuck.yaml", "name: stuck\nmax_epochs: 1\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
	dead := []string{"dl-purge", "dl-retry"}
	first := map[string]int64{}
	for _, id := range dead {
		start(t, c, "stuck", client.StartOptions{ID: id})
		r := waitRunning(t, c, id, 0)
		first[id] = r.Epoch
		loseOwner(t, n, r)
	}
	for _, id := range dead {
		waitStatus(t, c, id, "dead_lettered")
	}

	for _, o := range []client.ListOptions{{}, {Status: "running"}, {Workflow: "stuck"}} {
		runs, err := c.DeadLetters(ctx, o)
		if err != nil || !slices.Equal(sorted(ids(runs)), dead) {
			t.Fatalf("dead letters %+v: %v %v; want %v", o, ids(runs), err, dead)
		}
		for _, r := range runs {
			if r.Status != "dead_lettered" || r.Workflow != "stuck" || r.DeadLetter == "" || !r.Terminal() {
				t.Fatalf("dead letter %+v", r)
			}
		}
	}
	if runs, err := c.DeadLetters(ctx, client.ListOptions{Workflow: "other"}); err != nil || len(runs) != 0 {
		t.Fatalf("dead letters of another workflow: %v %v", ids(runs), err)
	}
	if runs, err := c.Runs(ctx, client.ListOptions{Status: "dead_lettered"}); err != nil || !slices.Equal(sorted(ids(runs)), dead) {
		t.Fatalf("runs dead_lettered: %v %v", ids(runs), err)
	}

	for _, id := range dead {
		r, err := c.DeadLetter(ctx, id)
		if err != nil || r.ID != id || r.Status != "dead_lettered" || r.DeadLetter == "" || r.MaxEpochs != 1 || r.EpochChanges < 1 {
			t.Fatalf("dead letter %s: %+v %v", id, r, err)
		}
		if len(r.Epochs) < 2 || r.Epochs[0].Epoch != first[id] || r.Epochs[0].Reason != "assigned" ||
			!slices.ContainsFunc(r.Epochs, func(e client.Epoch) bool { return e.Owner == "ghost" && e.Reason == "lease-expired" }) {
			t.Fatalf("dead letter %s epochs: %+v; want the first, then the lost owner's", id, r.Epochs)
		}
	}

	// Retry: out of the queue, running again in a new epoch, its changes reset.
	ch, err := c.RetryDeadLetter(ctx, "dl-retry")
	if err != nil || ch != (client.Change{ID: "dl-retry", Status: "pending"}) {
		t.Fatalf("retry dl-retry: %+v %v", ch, err)
	}
	r := waitRunning(t, c, "dl-retry", first["dl-retry"])
	if last := r.Epochs[len(r.Epochs)-1]; last.Reason != "retried" || r.EpochChanges != 0 || r.DeadLetter != "" {
		t.Fatalf("dl-retry after retry: %+v", r)
	}
	_, err = c.DeadLetter(ctx, "dl-retry")
	if ae := wantCode(t, err, client.CodeNotFound, "dead letter of a retried run"); !strings.Contains(ae.Message, "not in the dead-letter queue") {
		t.Fatalf("dead letter of a retried run: %q", ae.Message)
	}
	_, err = c.RetryDeadLetter(ctx, "dl-retry")
	wantCode(t, err, client.CodeNotFound, "retry a running run from the dead-letter queue")

	// Purge: cancelled for good, its history kept.
	ch, err = c.PurgeDeadLetter(ctx, "dl-purge")
	if err != nil || ch != (client.Change{ID: "dl-purge", Status: "cancelled"}) {
		t.Fatalf("purge dl-purge: %+v %v", ch, err)
	}
	if r, err := c.Run(ctx, "dl-purge"); err != nil || r.Status != "cancelled" || !strings.Contains(r.Error, "purged from the dead-letter queue") {
		t.Fatalf("dl-purge after purge: %+v %v", r, err)
	}
	evs, err := c.History(ctx, "dl-purge")
	// (The leader's reclaim that would have been the third epoch is the dead letter.)
	if err != nil || !slices.ContainsFunc(evs, func(e client.Event) bool { return e.Outcome == "dead-lettered" }) ||
		evs[len(evs)-1].Kind != "purge" {
		t.Fatalf("dl-purge history: %+v %v; want its dead letter, then the purge", evs, err)
	}
	_, err = c.DeadLetter(ctx, "dl-purge")
	wantCode(t, err, client.CodeNotFound, "dead letter of a purged run")
	_, err = c.PurgeDeadLetter(ctx, "dl-purge")
	wantCode(t, err, client.CodeNotFound, "purge a purged run")
	_, err = c.DeadLetter(ctx, "nope")
	wantCode(t, err, client.CodeNotFound, "dead letter of an unknown run")

	if runs, err := c.DeadLetters(ctx, client.ListOptions{}); err != nil || len(runs) != 0 {
		t.Fatalf("dead letters after retry and purge: %v %v; want none", ids(runs), err)
	}
	if ch, err := c.CancelRun(ctx, "dl-retry"); err != nil || ch.Status != "cancelled" {
		t.Fatalf("cancel dl-retry: %+v %v", ch, err)
	}
}

// No flowd answering is ErrUnreachable: nobody listening at the address, a node that
// stopped serving, and a node that stopped altogether.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := client.Dial("nats://" + addr)
	if !errors.Is(err, client.ErrUnreachable) || c != nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("dial a closed port: %v %v; want ErrUnreachable naming %s", c, err, addr)
	}

	n := startNode(t)
	c = dial(t, n.url, client.WithTimeout(10*time.Second))
	// late's calls are bounded: on a closed connection a read-only call is tried again
	// until its time is up (TestReadOnlyCallOnAClosedConnectionFailsAtOnce).
	late := dial(t, n.url, client.WithTimeout(500*time.Millisecond))
	ctx := ctxT(t, 30*time.Second)
	if _, err := c.Workflows(ctx); err != nil {
		t.Fatalf("while served: %v", err)
	}
	n.srv.Stop()
	var ae *client.Error
	for what, call := range map[string]func() error{
		"a read":  func() error { _, err := c.Workflows(ctx); return err },
		"a write": func() error { _, err := c.ApplyWorkflow(ctx, "w.yaml", []byte(wfV1)); return err },
		"a wait":  func() error { _, err := c.WaitRun(ctx, "x", time.Second); return err },
	} {
		began := time.Now()
		err := call()
		if !errors.Is(err, client.ErrUnreachable) || errors.As(err, &ae) {
			t.Fatalf("%s after the server stopped serving: %v; want ErrUnreachable", what, err)
		}
		if d := time.Since(began); d > 5*time.Second {
			t.Fatalf("%s after the server stopped serving took %s: no responders should be known at once", what, d)
		}
	}

	stopCtx := ctxT(t, 10*time.Second)
	if err := n.e.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Run(ctx, "x"); !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("a call after the node stopped: %v; want ErrUnreachable", err)
	}
}

// Close closes the connection Dial made (with the options given to it), and leaves the
// one given to New open.
func TestCloseClosesOnlyItsOwnConnection(t *testing.T) {
	n := startNode(t)
	ctx := ctxT(t, 30*time.Second)

	nc, err := nats.Connect(n.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := client.New(nc)
	if _, err := c.Workflows(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if nc.IsClosed() || !nc.IsConnected() {
		t.Fatal("Close closed the connection given to New")
	}
	if ws, err := client.New(nc).Workflows(ctx); err != nil || ws == nil {
		t.Fatalf("the connection after Close: %v %v", ws, err)
	}

	closed := make(chan struct{})
	var once sync.Once
	// (WithTimeout bounds the call after Close: see TestReadOnlyCallOnAClosedConnectionFailsAtOnce.)
	d, err := client.Dial(n.url, client.WithTimeout(500*time.Millisecond), client.WithNATSOptions(nats.ClosedHandler(func(*nats.Conn) { once.Do(func() { close(closed) }) })))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Workflows(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
		t.Fatal("Dial's connection closed before Close")
	default:
	}
	d.Close()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close left the connection Dial made open")
	}
	if _, err := d.Workflows(ctx); !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("a call after Close: %v; want ErrUnreachable", err)
	}
}

// WithTimeout bounds a whole call; WithAttemptTimeout bounds each try of a read-only
// call, which is tried again until the whole call's time is up, and not a write.
func TestTimeouts(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 30*time.Second)
	apply(t, c, "hold.yaml", wfHold)
	h := start(t, c, "hold", client.StartOptions{ID: "h-1"})

	const whole = 300 * time.Millisecond
	short := dial(t, n.url, client.WithTimeout(whole))
	began := time.Now()
	_, err := short.WaitRun(ctx, h, 20*time.Second) // the server would wait 20 s
	if d := time.Since(began); !errors.Is(err, client.ErrUnreachable) || d < whole || d > 10*time.Second {
		t.Fatalf("a 20s wait with WithTimeout(%s): %v after %s; want ErrUnreachable after about %s", whole, err, d, whole)
	}

	// Each try ends before any node could answer: a read is tried until the call's time
	// is up; a write is sent once and waits for its answer.
	tries := dial(t, n.url, client.WithTimeout(time.Second), client.WithAttemptTimeout(time.Nanosecond))
	began = time.Now()
	_, err = tries.Workflows(ctx)
	// (A try's answer can still win the race with its 1ns deadline now and then: the
	// read then succeeds, which is what retrying is for.)
	if d := time.Since(began); err != nil && (!errors.Is(err, client.ErrUnreachable) || d < time.Second) {
		t.Fatalf("a read whose tries all time out: %v after %s; want ErrUnreachable after the whole second", err, d)
	}
	if w, err := tries.ApplyWorkflow(ctx, "w.yaml", []byte(wfV1)); err != nil || w.Name != "w" {
		t.Fatalf("a write with a 1ns attempt timeout: %+v %v; want it applied (no attempt timeout on writes)", w, err)
	}
	if ch, err := c.CancelRun(ctx, h); err != nil || ch.Status != "cancelled" {
		t.Fatalf("cancel %s: %+v %v", h, ch, err)
	}
}

// Runs lists newest first by creation time (not in the order of IDs, which people
// choose), and 100 of them when ListOptions.Limit is zero, as its documentation says;
// Oldest lists the other way.
func TestRunsNewestFirstAndAHundredByDefault(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	ctx := ctxT(t, 60*time.Second)
	apply(t, c, "quick.yaml", wfQuick)
	var started []string
	for i := 0; i <= 100; i++ {
		started = append(started, start(t, c, "quick", client.StartOptions{ID: fmt.Sprintf("r-%03d", i)}))
	}
	runs, err := c.Runs(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newest := slices.Clone(started)
	slices.Reverse(newest)
	if got := ids(runs); !slices.Equal(got, newest[:100]) {
		t.Fatalf("Runs with the zero ListOptions: %d runs, first %v; want the newest 100 (%v ...)",
			len(got), got[:min(3, len(got))], newest[:3])
	}
	if runs, err = c.Runs(ctx, client.ListOptions{Oldest: true, Limit: 3}); err != nil || !slices.Equal(ids(runs), started[:3]) {
		t.Fatalf("the oldest 3: %v %v; want %v", ids(runs), err, started[:3])
	}
}

// A read-only call on a closed connection (after Close, or once the node it was
// connected to went away: Dial sets MaxReconnects(0)) fails at once with
// ErrUnreachable. (Found by this test: the call tried again on every error but
// no-responders, with no pause, spinning on a core until its whole timeout.)
func TestReadOnlyCallOnAClosedConnectionFailsAtOnce(t *testing.T) {
	n := startNode(t)
	// A whole call's time of 30 s, against which "at once" is anything under 10 s: the
	// spinning call took the whole timeout.
	c, err := client.Dial(n.url, client.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	began := time.Now()
	_, err = c.Workflows(context.Background())
	if d := time.Since(began); !errors.Is(err, client.ErrUnreachable) || d > 10*time.Second {
		t.Fatalf("a read on a closed connection: %v after %s; want ErrUnreachable at once, not after the call's 30 s", err, d)
	}
}

// A caller's own context ending is the caller's error (errors.Is context.Canceled), not
// ErrUnreachable: a program must tell its own cancellation from a cluster that is down.
// (Found by this test: it was reported as "no flowd answered".)
func TestCallerCancellationIsTheCallersError(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.url)
	apply(t, c, "hold.yaml", wfHold)
	h := start(t, c, "hold", client.StartOptions{ID: "h-1"})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := c.WaitRun(ctx, h, 20*time.Second)
	if !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("a wait whose context the caller cancelled: %v; want context.Canceled, not ErrUnreachable", err)
	}
}
