package epoch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/within"
	"github.com/flowrun/flow/logstream"
)

// These tests run electors in real processes (this test binary, re-executed) against a
// NATS server on loopback, and SIGKILL or SIGSTOP them. Each helper is a small flowd
// scheduler: it campaigns, and while it leads it writes a scheduler entry (a cron tick
// carrying its term and name) every 20 ms through its own checkpoint log.

const helperEnv = "FLOW_EPOCH_HELPER"

func helperMain() {
	if os.Getenv(helperEnv+"_MODE") == "lease" {
		leaseHelperMain()
		return
	}
	node := os.Getenv(helperEnv)
	skipCheck := os.Getenv(helperEnv+"_SKIP_CHECK") == "1"
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	fail := func(err error) { say("error %v", err); os.Exit(2) }
	nc, err := natsnode.Connect(os.Getenv(helperEnv+"_URL"), node)
	if err != nil {
		fail(err)
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	store, err := checkpoint.OpenStore(os.Getenv(helperEnv+"_DIR"), checkpoint.StoreOptions{})
	if err != nil {
		fail(err)
	}
	logCfg := logstream.DefaultConfig()
	src, err := jsport.OpenStream(ctx, js, jsport.LogConfig(1))
	if err != nil {
		fail(err)
	}
	logCfg.Stream, logCfg.Store, logCfg.Node = src, store, node
	lg, err := logstream.Open(logCfg)
	if err != nil {
		fail(err)
	}
	if err := lg.Start(ctx); err != nil {
		fail(err)
	}
	el, err := newElector(ctx, js, node, Config{TTL: testTTL, Backoff: fastBackoff}, 1)
	if err != nil {
		fail(err)
	}
	var tick atomic.Int64
	tick.Store(time.Now().UnixNano())
	for {
		term, err := el.Campaign(ctx)
		if err != nil {
			fail(err)
		}
		say("won %d", term.Term())
	acting:
		for {
			if !skipCheck {
				if err := term.Check(); err != nil {
					say("refused %d", term.Term())
					break
				}
			}
			e := checkpoint.Entry{Kind: checkpoint.KindCronTick, Term: term.Term(), Owner: node,
				Tick: &checkpoint.CronTick{Workflow: "hb", At: time.Unix(0, tick.Add(1)).UTC(), Outcome: checkpoint.TickMissed}}
			err := lg.Writer.Write(ctx, e).Await(ctx)
			switch {
			case err == nil:
				say("wrote %d", term.Term())
			case errors.Is(err, checkpoint.ErrStaleTerm):
				say("stale %d", term.Term())
				break acting
			default:
				say("error %v", err)
			}
			select {
			case <-term.Done():
				if !skipCheck {
					say("lost %d", term.Term())
					break acting
				}
			case <-time.After(20 * time.Millisecond): // the scheduler's pace, not a synchronisation
			}
		}
		_ = term.Resign(ctx)
	}
}

type event struct {
	node string
	verb string
	term int64
	at   time.Time
}

type cluster struct {
	t      *testing.T
	url    string
	dir    string
	events chan event
	mu     sync.Mutex
	procs  map[string]*exec.Cmd
	wg     sync.WaitGroup
}

func newCluster(t *testing.T, url string) *cluster {
	c := &cluster{t: t, url: url, dir: t.TempDir(), events: make(chan event, 4096), procs: map[string]*exec.Cmd{}}
	t.Cleanup(c.stopAll)
	return c
}

func (c *cluster) start(node string, skipCheck bool) {
	exe, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+node, helperEnv+"_URL="+c.url,
		helperEnv+"_DIR="+filepath.Join(c.dir, node))
	if skipCheck {
		cmd.Env = append(cmd.Env, helperEnv+"_SKIP_CHECK=1")
	}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.procs[node] = cmd
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			ev := event{node: node, verb: f[0], at: time.Now()}
			if len(f) > 1 {
				ev.term, _ = strconv.ParseInt(f[1], 10, 64)
			}
			if ev.verb == "error" {
				c.t.Errorf("%s: %s", node, sc.Text())
			}
			c.events <- ev
		}
	}()
}

func (c *cluster) signal(node string, sig syscall.Signal) {
	c.mu.Lock()
	cmd := c.procs[node]
	c.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
	if sig == syscall.SIGKILL {
		_ = within.Cmd(c.t, 30*time.Second, cmd, node+" after its SIGKILL")
		c.mu.Lock()
		delete(c.procs, node)
		c.mu.Unlock()
	}
}

func (c *cluster) stopAll() {
	c.mu.Lock()
	for _, cmd := range c.procs {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = within.Cmd(c.t, 30*time.Second, cmd, "a node after its SIGKILL")
	}
	c.procs = map[string]*exec.Cmd{}
	c.mu.Unlock()
	within.Group(c.t, 30*time.Second, &c.wg, "the nodes' output readers")
}

// await returns the first event matching, or fails after d.
func (c *cluster) await(d time.Duration, what string, match func(event) bool) event {
	c.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev := <-c.events:
			if match(ev) {
				return ev
			}
		case <-timeout:
			c.t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// watchLog gives the test its own view of the log the helpers write.
func watchLog(t *testing.T, srv *natsnode.Server) (*checkpoint.Store, *logstream.Log) {
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	store, err := checkpoint.OpenStore(filepath.Join(t.TempDir(), "state"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	logCfg := logstream.DefaultConfig()
	src, err := jsport.OpenStream(ctx, js, jsport.LogConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	logCfg.Stream, logCfg.Store, logCfg.Node = src, store, "observer"
	lg, err := logstream.Open(logCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Stop(); store.Close() })
	return store, lg
}

// checkOneLeaderPerTerm: every accepted scheduler entry of a term was written by one
// node, and accepted terms never go down in log order.
func checkOneLeaderPerTerm(t *testing.T, store *checkpoint.Store, lg *logstream.Log) map[int64]string {
	ctx := ctxT(t, 10*time.Second)
	last, err := lg.Applier.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.Applier.WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	ticks, err := store.Ticks("hb")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ticks, func(a, b checkpoint.Tick) int { return int(a.Seq) - int(b.Seq) })
	owners := map[int64]string{}
	var prev int64
	for _, tk := range ticks {
		if tk.Term < prev {
			t.Fatalf("accepted term went down: %d after %d (seq %d)", tk.Term, prev, tk.Seq)
		}
		prev = tk.Term
		if o, ok := owners[tk.Term]; ok && o != tk.Owner {
			t.Fatalf("two leaders acted on term %d: %s and %s", tk.Term, o, tk.Owner)
		}
		owners[tk.Term] = tk.Owner
	}
	return owners
}

// Leader crash: three processes campaign; the leader is SIGKILLed 5 times (10 with
// FLOW_LEASE_SIM=1, for the figures of docs/leases.md) and replaced; each time a new
// leader with a higher term appears, within a few TTLs, and no term is ever acted on by
// two nodes.
func TestLeaderCrashFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes for ~7 s")
	}
	rounds := 5
	if os.Getenv("FLOW_LEASE_SIM") != "" {
		rounds = 10
	}
	srv := startNATS(t)
	store, lg := watchLog(t, srv)
	c := newCluster(t, srv.ClientURL())
	for i := 1; i <= 3; i++ {
		c.start(fmt.Sprintf("node-%d", i), false)
	}
	won := c.await(15*time.Second, "a first leader", func(e event) bool { return e.verb == "won" })
	var failovers []time.Duration
	for round := 1; round <= rounds; round++ {
		c.await(5*time.Second, "the leader acting", func(e event) bool { return e.verb == "wrote" && e.term == won.term })
		killed := time.Now()
		c.signal(won.node, syscall.SIGKILL)
		c.start(fmt.Sprintf("node-%d", 3+round), false)
		prev := won
		// A TTL for the key to lapse, then the marker's delivery and a backoff draw: about
		// 1.3 s measured. The bound has the slack of a loaded machine (another TTL and two
		// seconds); it says a failover happened by the server's TTL, not by luck.
		limit := 2*testTTL + fastBackoff.Cap + 2*time.Second
		won = c.await(limit+10*time.Second, "a new leader", func(e event) bool { return e.verb == "won" && e.term > prev.term })
		d := won.at.Sub(killed)
		if d > limit {
			t.Errorf("round %d: new leader after %s, more than TTL + backoff (%s)", round, d, limit)
		}
		if won.node == prev.node {
			t.Fatalf("round %d: the killed node %s won again", round, won.node)
		}
		failovers = append(failovers, d)
	}
	c.await(5*time.Second, "the last leader acting", func(e event) bool { return e.verb == "wrote" && e.term == won.term })
	c.stopAll()
	slices.Sort(failovers)
	t.Logf("failover after SIGKILL (TTL %s): median %s, max %s, all %v", testTTL,
		failovers[len(failovers)/2].Round(time.Millisecond), failovers[len(failovers)-1].Round(time.Millisecond), failovers)
	owners := checkOneLeaderPerTerm(t, store, lg)
	if len(owners) < rounds+1 {
		t.Fatalf("only %d terms acted; want %d", len(owners), rounds+1)
	}
}

// Paused leader: SIGSTOP the leader past its TTL, then SIGCONT. Its local check sees
// its trust window has passed and it writes nothing. The negative control skips the
// local check: the write that slips through carries the old term and the log rejects it.
func TestPausedLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses processes")
	}
	for _, skipCheck := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip-local-check=%v", skipCheck), func(t *testing.T) {
			srv := startNATS(t)
			store, lg := watchLog(t, srv)
			c := newCluster(t, srv.ClientURL())
			c.start("paused", skipCheck)
			first := c.await(15*time.Second, "the first leader", func(e event) bool { return e.verb == "won" })
			c.await(5*time.Second, "the leader acting", func(e event) bool { return e.verb == "wrote" })
			c.start("other-1", false)
			c.start("other-2", false)
			c.signal("paused", syscall.SIGSTOP)
			next := c.await(10*time.Second, "a new leader", func(e event) bool { return e.verb == "won" && e.node != "paused" })
			c.await(5*time.Second, "the new leader acting", func(e event) bool { return e.verb == "wrote" && e.term == next.term })
			resumed := time.Now()
			c.signal("paused", syscall.SIGCONT)
			if skipCheck {
				c.await(10*time.Second, "the old leader's stale write rejected", func(e event) bool { return e.node == "paused" && e.verb == "stale" && e.term == first.term })
				t.Logf("old leader (term %d) resumed after term %d began; its unchecked write was rejected by the log", first.term, next.term)
			} else {
				ev := c.await(10*time.Second, "the old leader standing down", func(e event) bool {
					return e.node == "paused" && (e.verb == "refused" || e.verb == "lost" || e.verb == "stale")
				})
				if ev.verb == "stale" {
					t.Fatalf("the old leader wrote after resuming (rejected only by the log): its local check did not stop it")
				}
				t.Logf("old leader (term %d) resumed after term %d began and stood down: %s", first.term, next.term, ev.verb)
			}
			c.stopAll()
			checkOneLeaderPerTerm(t, store, lg)
			stale, err := store.StaleTerms()
			if err != nil {
				t.Fatal(err)
			}
			var oldTermRejected int
			for _, s := range stale {
				if s.Term == first.term {
					oldTermRejected++
				}
			}
			if skipCheck && oldTermRejected == 0 {
				t.Fatalf("negative control: no write of term %d reached the log to be rejected", first.term)
			}
			if !skipCheck && oldTermRejected != 0 {
				t.Fatalf("the paused leader wrote %d entries of term %d after resuming (%s); the local check should have stopped it", oldTermRejected, first.term, resumed)
			}
		})
	}
}
