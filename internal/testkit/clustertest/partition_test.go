package clustertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/within"
)

// The silent partition (issue 17): a node's NATS traffic goes through a Proxy that
// stops moving bytes while every connection stays open. TTL is the nodes' lease TTL.
const partitionTTL = 2 * time.Second

// flowdWithoutRecovery builds flowd whose supervisor never starts a stopped part again
// (supervise.noRecovery set at link time, empty in every other build): the negative
// control of TestSilentPartitionHeals.
func flowdWithoutRecovery(t *testing.T) string {
	return FlowdLinkedWith(t, "github.com/flowrun/flow/internal/base/supervise.noRecovery=1")
}

// partitioned is two flowd nodes on one nats-server: node-a through a Proxy (with its
// HTTP port, for /readyz), node-b directly.
type partitioned struct {
	t      *testing.T
	url    string
	proxy  *Proxy
	a, b   *Proc
	aHTTP  string
	cl     *client.Client
	runSeq int
}

func startPartitioned(t *testing.T, flowdBin string) *partitioned {
	return startPartitionedWith(t, flowdBin, nil)
}

// startPartitionedWith calls beforeB while node-a is the only node (and leads).
func startPartitionedWith(t *testing.T, flowdBin string, beforeB func(*partitioned)) *partitioned {
	url := startNATSServer(t)
	p := &partitioned{t: t, url: url, proxy: StartProxy(t, strings.TrimPrefix(url, "nats://"))}
	p.aHTTP = fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	ttl := partitionTTL.String()
	p.a = StartFlowd(t, &Cluster{URLs: []string{p.proxy.URL()}}, "node-a", "--lease-ttl", ttl, "--http", p.aHTTP)
	if flowdBin != "" {
		p.a.Kill()
		p.a.args[0] = flowdBin
		p.a.Restart(t)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node-a's log, warnings and up:\n%s", importantLines(LogOf(p.a), 60))
		}
	})
	p.cl = dial(t, &Cluster{URLs: []string{url}})
	// node-a starts alone, so it leads; node-b joins once it does.
	p.waitLeader(30*time.Second, "node-a", 0)
	if beforeB != nil {
		beforeB(p)
	}
	p.b = StartFlowd(t, &Cluster{URLs: []string{url}}, "node-b", "--lease-ttl", ttl)
	WaitFor(t, 30*time.Second, "node-b in the cluster", func() bool { return p.hasNode("node-b") })
	return p
}

// status is the cluster's status as some node answers it. The call has room for three
// tries (the client's 3 s each): while node-a is cut off, the NATS server still hands it
// about half the requests, which nobody answers; with room for one try a call fails
// on each of them, the likely cause of a 20 s wait for node-b to lead that saw no poll
// succeed (a fresh-clone CI run; docs/testing.md).
func (p *partitioned) status() (client.ClusterStatus, bool) {
	var st client.ClusterStatus
	ctx, cancel := context.WithTimeout(context.Background(), 9500*time.Millisecond)
	defer cancel()
	return st, callCtx(ctx, p.cl, "cluster.status", client.Request{}, &st) == nil
}

func (p *partitioned) hasNode(id string) bool {
	st, ok := p.status()
	if !ok {
		return false
	}
	for _, n := range st.Nodes {
		if n.ID == id {
			return true
		}
	}
	return false
}

// waitLeader waits until node leads with a term above after.
func (p *partitioned) waitLeader(d time.Duration, node string, after int64) int64 {
	p.t.Helper()
	var term int64
	WaitFor(p.t, d, node+" leading", func() bool {
		st, ok := p.status()
		term = st.Term
		return ok && st.Leader == node && st.Term > after
	})
	return term
}

func (p *partitioned) readyz() (int, string) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + p.aHTTP + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// metric reads one sample of node-a's /metrics ("" if absent).
func (p *partitioned) metric(name string) string {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + p.aHTTP + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strings.TrimPrefix(line, name+" ")
		}
	}
	return ""
}

// metricSum is the sum of node-a's series of the metric name, over their labels.
func (p *partitioned) metricSum(name string) float64 {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + p.aHTTP + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// cutAndHeal cuts node-a's traffic in dirs, waits until node-b leads and node-a says
// it is not ready, then heals. It returns node-b's term.
func (p *partitioned) cutAndHeal(term int64, dirs ...int) int64 {
	t := p.t
	t.Helper()
	p.proxy.Cut(dirs...)
	bTerm := p.waitLeader(20*time.Second, "node-b", term)
	WaitFor(t, 20*time.Second, "node-a not ready while cut off", func() bool { code, _ := p.readyz(); return code == http.StatusServiceUnavailable })
	_, why := p.readyz()
	t.Logf("cut %v: node-b leads (term %d); node-a's /readyz: %s", dirs, bTerm, why)
	p.proxy.Heal()
	return bTerm
}

// checkHealed: within TTL + 5 s of the heal node-a is ready and answers the API; then,
// node-b stopped, node-a wins the election within TTL + 5 s and runs a new run (it
// takes tasks). node-b is started again afterwards.
func (p *partitioned) checkHealed(bTerm int64) {
	t := p.t
	t.Helper()
	healed := time.Now()
	bound := partitionTTL + 5*time.Second
	WaitFor(t, bound, "node-a ready after the heal", func() bool { code, _ := p.readyz(); return code == http.StatusOK })
	WaitFor(t, bound-time.Since(healed)+time.Second, "node-a answering the API", func() bool { return p.hasNode("node-a") })
	t.Logf("node-a ready and answering %s after the heal", time.Since(healed).Round(10*time.Millisecond))
	p.b.Term(t)
	// node-b comes back even if this check fails, so that a failure here is reported
	// alone and not again by every cut after it (which waits for node-b to lead).
	defer func() {
		p.b.Restart(t)
		WaitFor(t, 30*time.Second, "node-b back in the cluster", func() bool { return p.hasNode("node-b") })
	}()
	stopped := time.Now()
	p.waitLeader(bound, "node-a", bTerm)
	t.Logf("node-a leads %s after node-b stopped", time.Since(stopped).Round(10*time.Millisecond))
	p.runSeq++
	var run client.Run
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := fmt.Sprintf("probe-%d", p.runSeq)
	began := time.Now()
	err := callCtx(ctx, p.cl, "run.start", client.Request{Workflow: "probe", ID: id}, &run)
	startTook := time.Since(began)
	if err == nil {
		err = callCtx(ctx, p.cl, "run.wait", client.Request{ID: id, Wait: "20s"}, &run)
	}
	if err != nil || run.Status != "succeeded" {
		// Tell a run node-a never ran from an answer that never came (seen once in each
		// of issue 30's two five-run series: the run succeeded on node-a 1.3 s after it
		// led, yet run.wait went unanswered for 30 s; docs/testing.md).
		gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer gcancel()
		var now client.Run
		gerr := callCtx(gctx, p.cl, "run.get", client.Request{ID: id}, &now)
		t.Fatalf("a run after the heal, node-a alone (its start answered after %s): %v, %+v; run.get now: status %q, err %v", startTook.Round(10*time.Millisecond), err, run, now.Status, gerr)
	}
}

// A node cut off by a silent partition, in both directions and in each one alone, is
// taken over while cut off, says it is not ready, and comes back whole once healed:
// ready, answering, taking tasks, and leading when it is the only node left.
func TestSilentPartitionHeals(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a flowd process off NATS three times")
	}
	p := startPartitioned(t, "")
	if err := call(t, p.cl, "workflow.apply", client.Request{File: "probe.yaml", YAML: "name: probe\nsteps:\n  - name: a\n    uses: noop\n"}, nil); err != nil {
		t.Fatal(err)
	}
	term := p.waitLeader(10*time.Second, "node-a", 0)
	for _, c := range []struct {
		name string
		dirs []int
	}{{"both", []int{Up, Down}}, {"it-cannot-publish", []int{Up}}, {"it-hears-nothing", []int{Down}}} {
		t.Run(c.name, func(t *testing.T) {
			p.t = t
			bTerm := p.cutAndHeal(term, c.dirs...)
			p.checkHealed(bTerm)
			term = p.waitLeader(10*time.Second, "node-a", bTerm)
		})
	}
	p.t = t
	if r, _ := strconv.Atoi(p.metric("flow_nats_reconnects_total")); r < 3 {
		t.Errorf("flow_nats_reconnects_total = %d after three cuts, want >= 3", r)
	}
	if r := p.metricSum("flow_part_restarts_total"); r < 1 {
		t.Errorf("flow_part_restarts_total = %g (over its parts) after three cuts, want >= 1", r)
	}
	if !strings.Contains(LogOf(p.a), `"msg":"part recovered"`) {
		t.Errorf("node-a's log does not say which part recovered:\n%s", tail(LogOf(p.a)))
	}
}

// The negative control: the same flowd with its supervisor's recovery switched off.
// Healed, node-a is connected again, yet it never leads again: its election stopped
// during the cut (issue 17's report: no leader in the cluster, every new run pending).
func TestSilentPartitionWithoutRecoveryNeverLeadsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a flowd process off NATS")
	}
	p := startPartitioned(t, flowdWithoutRecovery(t))
	term := p.waitLeader(10*time.Second, "node-a", 0)
	bTerm := p.cutAndHeal(term, Up, Down)
	WaitFor(t, 20*time.Second, "node-a connected again", func() bool {
		code, why := p.readyz()
		return code != 0 && !strings.Contains(why, "NATS is not reachable")
	})
	p.b.Term(t)
	// Three times the time the recovering build is given: a leader would have come.
	deadline := time.Now().Add(3 * (partitionTTL + 5*time.Second))
	for time.Now().Before(deadline) {
		if st, ok := p.status(); ok && st.Leader != "" {
			t.Fatalf("node-a leads again (term %d > %d) with recovery off: the control does not reproduce the failure", st.Term, bTerm)
		}
		time.Sleep(200 * time.Millisecond) // sampling the cluster's leader over the window
	}
	if !strings.Contains(LogOf(p.a), "recovery is switched off") {
		t.Fatalf("node-a's log does not show a part that stopped for good:\n%s", tail(LogOf(p.a)))
	}
}

// Term SIGTERMs the process (it drains) and waits for it to exit.
func (pr *Proc) Term(t testing.TB) {
	t.Helper()
	_ = pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s of SIGTERM", pr.Name)
	}
}

// importantLines is the last n lines of a JSON log that are not debug.
func importantLines(log string, n int) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if l != "" && !strings.Contains(l, `"level":"DEBUG"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], "\n")
}

// downstream is the service a run's http steps call: it records each request's epoch
// and step in arrival order, and takes a while to answer.
type downstream struct {
	mu   sync.Mutex
	reqs []downstreamReq
}

type downstreamReq struct {
	epoch int64
	step  string
}

func (d *downstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep, _ := strconv.ParseInt(r.Header.Get("Flow-Epoch"), 10, 64)
	d.mu.Lock()
	d.reqs = append(d.reqs, downstreamReq{ep, r.Header.Get("Flow-Step")})
	d.mu.Unlock()
	select { // the work the request asks for
	case <-time.After(250 * time.Millisecond):
	case <-r.Context().Done():
		return
	}
	fmt.Fprintln(w, `{"ok": true}`)
}

func (d *downstream) requests() []downstreamReq {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]downstreamReq(nil), d.reqs...)
}

// The fencing half of the silent partition: node-a owns a run of http steps and is cut
// off. Its kill switch stops its step work at 2/3 of the TTL, node-b takes the run over
// with a new epoch, and not one request of the old epoch reaches the downstream service
// after the new epoch's first; a late commit of the old epoch, if one arrives after the
// heal, is fenced. Once healed, node-a is ready again within TTL + 5 s.
func TestSilentPartitionOfARunsOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a flowd process off NATS while it runs a run")
	}
	ds := &downstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ds, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	var yaml strings.Builder
	yaml.WriteString("name: downstream\nsteps:\n")
	const steps = 24
	for i := range steps {
		fmt.Fprintf(&yaml, "  - name: s%02d\n    uses: http\n    with: {url: \"http://%s/s%02d\", method: POST, body: {n: %d}}\n", i, ln.Addr(), i, i)
		if i > 0 {
			fmt.Fprintf(&yaml, "    needs: [s%02d]\n", i-1)
		}
	}
	const id = "owned-by-a"
	p := startPartitionedWith(t, "", func(p *partitioned) {
		// node-a alone: the run is its own.
		if err := call(t, p.cl, "workflow.apply", client.Request{File: "downstream.yaml", YAML: yaml.String()}, nil); err != nil {
			t.Fatal(err)
		}
		if err := call(t, p.cl, "run.start", client.Request{Workflow: "downstream", ID: id}, nil); err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 20*time.Second, "node-a's first request downstream", func() bool { return len(ds.requests()) > 0 })
	})
	get := func() client.Run {
		var r client.Run
		_ = call(t, p.cl, "run.get", client.Request{ID: id}, &r)
		return r
	}
	first := get()
	if first.Owner != "node-a" {
		t.Fatalf("the run is owned by %q, want node-a", first.Owner)
	}
	p.proxy.Cut(Up, Down)
	WaitFor(t, 30*time.Second, "node-b owning the run with a new epoch", func() bool {
		r := get()
		return r.Owner == "node-b" && r.Epoch > first.Epoch
	})
	p.proxy.Heal()
	healed := time.Now()
	WaitFor(t, partitionTTL+5*time.Second, "node-a ready after the heal", func() bool { code, _ := p.readyz(); return code == http.StatusOK })
	t.Logf("node-a ready %s after the heal", time.Since(healed).Round(10*time.Millisecond))
	var final client.Run
	WaitFor(t, 60*time.Second, "the run to succeed", func() bool { final = get(); return final.Status == "succeeded" })

	reqs := ds.requests()
	firstNew := -1
	perStep := map[string]int{}
	for i, r := range reqs {
		perStep[r.step]++
		if r.epoch > first.Epoch && firstNew < 0 {
			firstNew = i
		}
		if r.epoch == first.Epoch && firstNew >= 0 {
			t.Errorf("request %d (step %s) of the old epoch %d reached the service after the new epoch's first (request %d)", i, r.step, r.epoch, firstNew)
		}
	}
	if firstNew < 0 {
		t.Fatalf("no request of a new epoch: the cut did not move the run (%d requests)", len(reqs))
	}
	repeated := 0
	for step, n := range perStep {
		if n > 1 {
			repeated++
			if n > 2 {
				t.Errorf("step %s was requested %d times", step, n)
			}
		}
	}
	if len(perStep) != steps || repeated > 1 {
		t.Errorf("%d steps requested, %d of them more than once: want %d, and at most the step in flight at the cut again", len(perStep), repeated, steps)
	}
	var v client.Verification
	if err := call(t, p.cl, "run.verify", client.Request{ID: id}, &v); err != nil || !v.OK {
		t.Errorf("run verify: %v %+v", err, v)
	}
	t.Logf("%d requests; the new epoch's first was #%d; epochs %d -> %d; %d fenced commits", len(reqs), firstNew, first.Epoch, final.Epoch, len(final.Fenced))
}

// An external NATS server restarted (SIGTERM, as for an upgrade) comes back without
// flow's memory-storage stream and bucket (FLOW_TASKS, FLOW_LEASES). The node reconnects,
// creates them again and carries on: ready, and a new run succeeds on it. Before, every
// lease acquire and the leader's lease watch failed on "stream not found" until flowd
// itself was restarted.
func TestNATSServerRestartWithoutMemoryStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a nats-server process")
	}
	srv, url := startNATSServerProc(t)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	node := StartFlowd(t, &Cluster{URLs: []string{url}}, "node-a", "--lease-ttl", partitionTTL.String(), "--http", httpAddr)
	p := &partitioned{t: t, url: url, a: node, aHTTP: httpAddr}
	p.cl = dial(t, &Cluster{URLs: []string{url}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node-a's log, warnings and up:\n%s", importantLines(LogOf(node), 40))
		}
	})
	p.waitLeader(30*time.Second, "node-a", 0)
	if err := call(t, p.cl, "workflow.apply", client.Request{File: "probe.yaml", YAML: "name: probe\nsteps:\n  - name: a\n    uses: noop\n"}, nil); err != nil {
		t.Fatal(err)
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	within.Recv(t, 30*time.Second, srv.done, "the nats-server's exit after its SIGTERM")
	WaitFor(t, 10*time.Second, "node-a not ready while NATS is down", func() bool { code, _ := p.readyz(); return code == http.StatusServiceUnavailable })
	srv.Restart(t)
	restarted := time.Now()
	waitJetStream(t, &Cluster{URLs: []string{url}})
	p.cl.Close()
	p.cl = dial(t, &Cluster{URLs: []string{url}})
	bound := 4*partitionTTL + 5*time.Second // reconnect, then a part's silence limit (>= 4 s) and its backoff
	WaitFor(t, bound, "node-a ready after the NATS restart", func() bool { code, _ := p.readyz(); return code == http.StatusOK })
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for _, stream := range []string{"FLOW_TASKS", "KV_FLOW_LEASES"} {
		WaitFor(t, bound, stream+" created again", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := js.Stream(ctx, stream)
			return err == nil
		})
	}
	t.Logf("ready and both streams back %s after the restart", time.Since(restarted).Round(10*time.Millisecond))
	p.runSeq = 100
	var run client.Run
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = callCtx(ctx, p.cl, "run.start", client.Request{Workflow: "probe", ID: "after-restart"}, &run)
	if err == nil {
		err = callCtx(ctx, p.cl, "run.wait", client.Request{ID: "after-restart", Wait: "20s"}, &run)
	}
	if err != nil || run.Status != "succeeded" {
		t.Fatalf("a run after the NATS restart: %v, %+v", err, run)
	}
}
