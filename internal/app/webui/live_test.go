package webui

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/testkit/testnode"
)

// countingAPI is the API server as the UI's backend, counting the live streams' reads:
// run.get (caught up with the log: two JetStream requests each) and AppliedRun (the
// node's state as it stands).
type countingAPI struct {
	*apiserver.Server
	gets, applied atomic.Int64
}

func (c *countingAPI) Do(ctx context.Context, op string, req client.Request) (any, error) {
	if op == "run.get" {
		c.gets.Add(1)
	}
	return c.Server.Do(ctx, op, req)
}

func (c *countingAPI) AppliedRun(id string) (client.Run, error) {
	c.applied.Add(1)
	return c.Server.AppliedRun(id)
}

// startLiveNode is a real engine and API server with the UI over them on a real HTTP
// server, the UI signing in otto (operator) and vera (viewer) when signIn is set.
func startLiveNode(tb testing.TB, signIn bool) (*testNode, *countingAPI) {
	tb.Helper()
	users := []engine.NATSUser{{Name: "otto", Password: "o-pw", Role: client.RoleOperator}, {Name: "vera", Password: "v-pw", Role: client.RoleViewer}}
	e := testnode.Engine(tb, func(c *engine.Config) {
		c.NATSListen = "-"
		if signIn {
			c.NATSAuth, c.NATSUsers = true, users
		}
	})
	api, err := apiserver.Serve(apiserver.Config{Node: e.API()})
	if err != nil {
		tb.Fatal(err)
	}
	counting := &countingAPI{Server: api}
	cfg := Config{Backend: counting}
	if signIn {
		cfg.SignIn = true
		for _, u := range users {
			cfg.Users = append(cfg.Users, User{Name: u.Name, Password: u.Password, Role: u.Role})
		}
	}
	ui, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	n := &testNode{e: e, api: api, ui: ui, srv: httptest.NewServer(ui)}
	tb.Cleanup(func() {
		ui.Close()
		n.srv.Close()
		api.Stop()
	})
	return n, counting
}

// streamClient is a browser of its own (cookies, its own connections, closed at the
// end) without a timeout: a stream's life is its context's.
func streamClient(tb testing.TB) *http.Client {
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Jar: jar, Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signInStream signs c in as user.
func signInStream(tb testing.TB, c *http.Client, base, user, pw string) {
	tb.Helper()
	resp, err := c.PostForm(base+"/ui/login", url.Values{"user": {user}, "password": {pw}, "next": {"/ui/"}})
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		tb.Fatalf("%s's sign-in: %d", user, resp.StatusCode)
	}
}

// liveStream is an open stream's answer and a reader of its events.
type liveStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

// openStream GETs u; a stream (200) stays open until ctx ends or its body is read to
// the end; any other answer is read and closed, its body in body.
func openStream(ctx context.Context, c *http.Client, u string) (s *liveStream, code int, body string, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, "", err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, resp.StatusCode, string(b), nil
	}
	return &liveStream{resp: resp, sc: bufio.NewScanner(resp.Body)}, http.StatusOK, "", nil
}

// next is the stream's next event's name ("" at its end).
func (s *liveStream) next() string {
	for s.sc.Scan() {
		if line := s.sc.Text(); strings.HasPrefix(line, "event: ") {
			return strings.TrimPrefix(line, "event: ")
		}
	}
	return ""
}

// rest reads the stream to its end: its remaining events.
func (s *liveStream) rest() []string {
	var out []string
	for ev := s.next(); ev != ""; ev = s.next() {
		out = append(out, ev)
	}
	return out
}

func (s *liveStream) close() { s.resp.Body.Close() }

const gateWorkflow = "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}\n  - {name: b, needs: [w], uses: noop}\n"

// startParked starts a run of gate that waits for its signal.
func startParked(tb testing.TB, n *testNode, ctx context.Context, id string) {
	tb.Helper()
	if _, err := n.e.StartRun(ctx, "gate", nil, engine.RunOptions{ID: id}); err != nil {
		tb.Fatal(err)
	}
	for {
		changed := n.e.Changed()
		if r, err := n.e.API().Run(id); err == nil && r.Status == "waiting" {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			tb.Fatalf("run %s never waited", id)
		}
	}
}

var dataEventsRe = regexp.MustCompile(`data-events="([^"]+)"`)

// eventsURL is the stream a run's page opens (with the page's seen).
func eventsURL(t *testing.T, c *http.Client, base, id string) string {
	t.Helper()
	_, page := get(t, c, base+"/ui/runs/"+id)
	m := dataEventsRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the page of %s holds no stream:\n%s", id, page)
	}
	return base + strings.ReplaceAll(m[1], "&amp;", "&")
}

// Issue 36: one viewer's live streams beyond streamsPerUser are refused at once with
// 429 and a message that says so, while another user's stream still opens and follows
// its run to the end; every stream given back, nothing is held. The control, without
// the bounds, accepts the extra stream: the test can fail.
func TestLiveStreamsPerUserCap(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			n, _ := startLiveNode(t, true)
			if control {
				n.ui.live = newLiveStreams(0, 0)
			}
			ctx := ctxT(t)
			n.apply(t, gateWorkflow)
			startParked(t, n, ctx, "g1")
			vera, otto := streamClient(t), streamClient(t)
			signInStream(t, vera, n.srv.URL, "vera", "v-pw")
			signInStream(t, otto, n.srv.URL, "otto", "o-pw")
			events := eventsURL(t, vera, n.srv.URL, "g1")

			var held []*liveStream
			defer func() {
				for _, s := range held {
					s.close()
				}
			}()
			for i := range streamsPerUser {
				s, code, body, err := openStream(ctx, vera, events)
				if err != nil || code != http.StatusOK {
					t.Fatalf("vera's stream %d: %d %q %v", i+1, code, body, err)
				}
				held = append(held, s)
			}
			s, code, body, err := openStream(ctx, vera, events)
			if err != nil {
				t.Fatal(err)
			}
			if s != nil {
				held = append(held, s)
			}
			if control {
				if code != http.StatusOK {
					t.Fatalf("without the bounds, vera's stream %d got %d %q", streamsPerUser+1, code, body)
				}
			} else if code != http.StatusTooManyRequests || !strings.Contains(body, "too many live streams") || !strings.Contains(body, "vera holds 16") {
				t.Fatalf("vera's stream %d got %d %q; want 429 saying why", streamsPerUser+1, code, body)
			}

			// otto's stream opens and follows the run to its end.
			o, code, body, err := openStream(ctx, otto, eventsURL(t, otto, n.srv.URL, "g1"))
			if err != nil || code != http.StatusOK {
				t.Fatalf("otto's stream, beside vera's %d: %d %q %v", len(held), code, body, err)
			}
			held = append(held, o)
			if err := n.e.Signal(ctx, "g1", "go", engine.SignalOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := o.rest(); len(got) < 2 || got[0] != "change" || got[len(got)-1] != "end" {
				t.Fatalf("otto's stream said %v; want changes, then its end", got)
			}
			for i, s := range held[:len(held)-1] { // each of vera's ends with the run
				if got := s.rest(); len(got) == 0 || got[len(got)-1] != "end" {
					t.Fatalf("vera's stream %d said %v", i+1, got)
				}
			}
			// Read to their ends, the handlers have returned: nothing is held.
			if total, ofVera, watchers := n.ui.live.counts("vera"); total != 0 || ofVera != 0 || watchers != 0 {
				t.Fatalf("after the streams ended: %d held, %d of vera's, %d watchers", total, ofVera, watchers)
			}
		})
	}
}

// Issue 36: the node's bound holds whoever opens the streams; without sign-in (no user
// to count by) it is the only one. The control, without it, accepts the extra stream.
func TestLiveStreamsNodeBound(t *testing.T) {
	const bound = streamsPerUser + 4 // more than one user's share: the anonymous are not counted as one
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			n, _ := startLiveNode(t, false)
			n.ui.live = newLiveStreams(streamsPerUser, bound)
			if control {
				n.ui.live = newLiveStreams(0, 0)
			}
			ctx := ctxT(t)
			n.apply(t, gateWorkflow)
			startParked(t, n, ctx, "g1")
			c := streamClient(t)
			events := eventsURL(t, c, n.srv.URL, "g1")
			var held []*liveStream
			defer func() {
				for _, s := range held {
					s.close()
				}
			}()
			for i := range bound {
				s, code, body, err := openStream(ctx, c, events)
				if err != nil || code != http.StatusOK {
					t.Fatalf("stream %d: %d %q %v", i+1, code, body, err)
				}
				held = append(held, s)
			}
			s, code, body, err := openStream(ctx, c, events)
			if err != nil {
				t.Fatal(err)
			}
			if s != nil {
				held = append(held, s)
			}
			if control {
				if code != http.StatusOK {
					t.Fatalf("without the bound, stream %d got %d %q", bound+1, code, body)
				}
				return
			}
			if code != http.StatusTooManyRequests || !strings.Contains(body, fmt.Sprintf("this node serves %d", bound)) {
				t.Fatalf("stream %d got %d %q; want 429 saying why", bound+1, code, body)
			}
		})
	}
}

// Issue 36: the streams of a run share one reader. A change of a run that 40 pages
// follow is read once from the node's state, not 40 times caught up with the log (two
// JetStream requests each), and each page is told. The control reads as before (each
// stream, each change): the test can fail.
func TestLiveStreamsShareOneReader(t *testing.T) {
	const pages = 40
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			n, api := startLiveNode(t, false)
			n.ui.hooks.perStreamReads = control
			ctx := ctxT(t)
			// A second wait takes the nudge that changes the parked run (a signal no step
			// waits for is refused).
			n.apply(t, gateWorkflow+"  - {name: n, needs: [w], uses: wait, with: {signal: nudge}}\n")
			startParked(t, n, ctx, "g1")
			c := streamClient(t)
			var streams []*liveStream
			defer func() {
				for _, s := range streams {
					s.close()
				}
			}()
			for i := range pages {
				// A seen that is not the run's: each stream says change after its first read.
				s, code, body, err := openStream(ctx, c, n.srv.URL+"/ui/runs/g1/events?seen=stale")
				if err != nil || code != http.StatusOK {
					t.Fatalf("stream %d: %d %q %v", i+1, code, body, err)
				}
				if ev := s.next(); ev != "change" {
					t.Fatalf("stream %d's first event: %q", i+1, ev)
				}
				streams = append(streams, s)
			}
			gets, applied := api.gets.Load(), api.applied.Load()
			if err := n.e.Signal(ctx, "g1", "nudge", engine.SignalOptions{}); err != nil { // into the inbox: the run changes, still waiting
				t.Fatal(err)
			}
			for i, s := range streams {
				if ev := s.next(); ev != "change" {
					t.Fatalf("stream %d after the signal: %q", i+1, ev)
				}
			}
			gets, applied = api.gets.Load()-gets, api.applied.Load()-applied
			t.Logf("the change of a run %d pages follow: %d reads caught up with the log, %d of the node's state", pages, gets, applied)
			if control {
				if gets < pages {
					t.Fatalf("the control read %d times caught up; want one a stream at least (%d)", gets, pages)
				}
			} else if gets != 0 || applied < 1 || applied >= pages {
				t.Fatalf("%d reads caught up and %d of the node's state for %d pages; want none and one a wake", gets, applied, pages)
			}
			if err := n.e.Signal(ctx, "g1", "go", engine.SignalOptions{}); err != nil {
				t.Fatal(err)
			}
			for i, s := range streams {
				if got := s.rest(); len(got) == 0 || got[len(got)-1] != "end" {
					t.Fatalf("stream %d said %v; want its end", i+1, got)
				}
			}
		})
	}
}

// Close ends the streams and their runs' watchers (goleak, in TestMain, checks nothing
// is left).
func TestLiveStreamsEndAtClose(t *testing.T) {
	n, _ := startLiveNode(t, false)
	ctx := ctxT(t)
	n.apply(t, gateWorkflow)
	startParked(t, n, ctx, "g1")
	c := streamClient(t)
	s, code, _, err := openStream(ctx, c, n.srv.URL+"/ui/runs/g1/events?seen=stale")
	if err != nil || code != http.StatusOK {
		t.Fatal(code, err)
	}
	defer s.close()
	if ev := s.next(); ev != "change" {
		t.Fatalf("first event %q", ev)
	}
	done := make(chan struct{})
	go func() { n.ui.Close(); close(done) }()
	s.rest() // ends when the server ends the stream
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return")
	}
	if total, _, watchers := n.ui.live.counts(""); total != 0 || watchers != 0 {
		t.Fatalf("after Close: %d held, %d watchers", total, watchers)
	}
}
