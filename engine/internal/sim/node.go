package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/steps"
)

// A node is one flowd: a real engine (engine.NewOver) over the node's ports, its Pebble
// state on an in-memory disk that a kill keeps, its clock. Each start is an incarnation:
// a kill ends the incarnation's calls (errDead) and its step processes at once, and its
// engine's goroutines wind down while the node is gone; a restart builds a new engine
// on the same disk.
type node struct {
	s    *Sim
	id   int
	name string
	fs   vfs.FS
	skew time.Duration

	inc         int  // the current incarnation (the loop's)
	alive       bool // an incarnation runs (starting, up or draining)
	up          bool // its engine started: the client may call it
	paused      bool
	partitioned bool
	logCut      bool // only the log's stream is out of reach (its stream leader is elsewhere than the buckets')
	slowUntil   time.Time
	slowBy      time.Duration

	reads int // the newest log format it reads (the old node's 1 until it is upgraded)

	heldOut []*pcall // calls made while paused: sent at the resume
	heldIn  []func() // answers and timer fires that came while paused
	procs   map[*proc]struct{}

	eng  *engine.Engine
	life *life // the current incarnation's engine's life
}

// life is one incarnation's engine, from its Start to the end of its Stop.
type life struct {
	inc     int
	eng     *engine.Engine
	started chan struct{} // closed when Start returned (err says how)
	stopped chan struct{} // closed when the engine has stopped (its store is closed)
	err     error
	halting bool // its Stop was called (the loop's): once
}

func newNode(s *Sim, i int) *node {
	n := &node{s: s, id: i, name: fmt.Sprintf("n%d", i+1), fs: vfs.NewMem(), skew: s.cfg.Skew[i],
		procs: map[*proc]struct{}{}, reads: checkpoint.MaxReadFormat()}
	if i == s.cfg.OldNode {
		n.reads = checkpoint.LogFormatJSON // a release before the cluster version
	}
	return n
}

// upgrade restarts the node reading the newest log format (a new binary, after a
// SIGKILL: what it did of its runs is reclaimed), or has its next start do so.
func (n *node) upgrade() {
	s := n.s
	n.reads = checkpoint.MaxReadFormat()
	s.stats.Upgrades++
	s.tracef(n.name, "UPGRADED: it reads log formats up to %d from its next start", n.reads)
	if n.alive {
		n.die(true)
		s.after(100*time.Millisecond, n.restart)
	}
}

// lateness is how late a slow node's events run now.
func (n *node) lateness() time.Duration {
	if n.s.now.Before(n.slowUntil) && n.slowBy > 0 {
		return time.Duration(n.s.rng.Int64N(int64(n.slowBy)))
	}
	return 0
}

// People the client acts as: the embedded server would know them from --auth.
var people = []engine.NATSUser{
	{Name: "ops", Password: "sim-password-ops", Role: "operator"},
	{Name: "fin1", Password: "sim-password-fin1", Role: "operator"},
	{Name: "fin2", Password: "sim-password-fin2", Role: "operator"},
	{Name: "fin3", Password: "sim-password-fin3", Role: "admin"},
}

// labels are the node's worker labels: finance on the finance node of a seed with
// labelled runs (Config.LabelledRuns), none elsewhere.
func (n *node) labels() []string {
	if n.s.cfg.LabelledRuns > 0 && n.id == n.s.cfg.FinanceNode {
		return []string{"finance"}
	}
	return nil
}

// boot starts a new incarnation: its engine is built and started on a goroutine of its
// own (Start makes calls the loop must answer); the node is up when Start returns.
func (n *node) boot() {
	s := n.s
	n.inc++
	inc := n.inc
	n.alive, n.up, n.paused, n.heldOut, n.heldIn = true, false, false, nil, nil
	clk := nodeClock{n}
	reg := steps.NewRegistry(1 << 20)
	if err := reg.Register(simStepKind, n.stepKind(inc)); err != nil {
		s.fail("sim", "%s: register the step kind: %v", n.name, err)
		return
	}
	cfg := engine.Config{NodeID: n.name, Workers: s.cfg.Slots, Registry: reg, Clock: clk, Logger: n.logger(),
		Lease:             epoch.Config{TTL: s.cfg.TTL, AllowShortTTL: true},
		ReconcileInterval: s.cfg.ReconcileInterval, LockDelay: s.cfg.LockDelay,
		NATSAuth: true, NATSUsers: people, ParkAfter: s.cfg.TTL, ReadFormat: n.reads, Labels: n.labels(),
		PriorityAging: priorityAging}
	s.check.Member(n.name, n.reads) // a member of the cluster from this start on
	e, err := engine.NewOver(cfg, engine.Over{Ports: nodePorts{n, inc}.ports(), FS: n.fs, StateDir: "state",
		Nonce: fmt.Sprintf("%s-%d", n.name, inc), Order: n.order, Hooks: s.cfg.Switches.Hooks})
	if err != nil {
		s.fail("sim", "%s: %v", n.name, err)
		return
	}
	l := &life{inc: inc, eng: e, started: make(chan struct{}), stopped: make(chan struct{})}
	n.life, n.eng = l, e
	s.lives = append(s.lives, l)
	s.tracef(n.name, "starts (incarnation %d)", inc)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := e.Start(ctx)
		l.err = err
		close(l.started)
		if err != nil {
			close(l.stopped) // Start closed everything it opened
		}
		s.submit(n.name, "started", func() { n.started(l, err) })
	}()
}

// started is the end of an incarnation's Start.
func (n *node) started(l *life, err error) {
	s := n.s
	if l.inc != n.inc {
		return // killed meanwhile
	}
	if err != nil {
		s.tracef(n.name, "start failed: %v", err)
		n.alive = false
		s.after(500*time.Millisecond, n.restart)
		return
	}
	n.up = true
	s.tracef(n.name, "up")
}

// stopEngine stops an incarnation's engine on a goroutine once its Start has returned:
// with its ports dead (a kill) its drain reaches nothing; with them live (a drain) it
// hands its runs back.
func (n *node) stopEngine(l *life, then func()) {
	s := n.s
	if l.halting {
		return // a kill during a drain: the drain's Stop goes on, unheard now
	}
	l.halting = true
	go func() {
		<-l.started
		if l.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = l.eng.Stop(ctx)
			cancel()
			close(l.stopped)
		}
		s.submit(n.name, "stopped", then)
	}()
}

// kill is a SIGKILL: nothing the incarnation sent or will send arrives, its processes die
// with it, and its engine winds down unheard.
func (n *node) kill() {
	s := n.s
	if !n.alive {
		return
	}
	s.stats.Kills++
	s.tracef(n.name, "KILLED")
	n.die(true)
}

// die ends the incarnation at once: nothing of it reaches the world from now on. With
// stop, its engine is stopped (it was not already: a drain stopped it).
func (n *node) die(stop bool) {
	s := n.s
	l := n.life
	dead := n.inc
	n.inc++ // the dead incarnation's number is no one's
	n.alive, n.up, n.paused = false, false, false
	held := n.heldOut
	n.heldOut, n.heldIn = nil, nil
	for _, c := range held {
		s.deliverNow(c, result{err: fmt.Errorf("%s: %w", c.label, errDead)})
	}
	s.endCalls(n, dead)
	for p := range n.procs {
		s.endProc(p, errDead)
	}
	if l != nil && stop {
		n.stopEngine(l, func() {})
	}
}

// restart starts a new incarnation once the last one's engine has stopped (its store
// closed: the disk is the node's).
func (n *node) restart() {
	s := n.s
	if n.alive {
		return
	}
	if l := n.life; l != nil {
		select {
		case <-l.stopped:
		default:
			s.after(100*time.Millisecond, n.restart)
			return
		}
	}
	n.boot()
}

// drain is a SIGTERM: the engine drains (its runs handed back) and stops; the node
// restarts later.
func (n *node) drain(back time.Duration) {
	s := n.s
	if !n.up || n.paused {
		return
	}
	s.stats.Drains++
	s.tracef(n.name, "DRAINING")
	n.up = false
	l := n.life
	n.stopEngine(l, func() {
		if l.inc != n.inc {
			return // killed while draining
		}
		s.tracef(n.name, "drained")
		n.die(false)
		s.after(back, n.restart)
	})
}

func (n *node) pause() {
	if !n.alive || n.paused {
		return
	}
	n.s.stats.Pauses++
	n.paused = true
	n.s.tracef(n.name, "PAUSED")
}

// resume sends what the node sent while paused and delivers what came meanwhile, in the
// order it came.
func (n *node) resume() {
	s := n.s
	if !n.paused {
		return
	}
	n.paused = false
	s.tracef(n.name, "resumed")
	out, in := n.heldOut, n.heldIn
	n.heldOut, n.heldIn = nil, nil
	for _, c := range out {
		s.send(c)
	}
	for _, f := range in {
		f()
		synctest.Wait() // one delivery at a time: a select never sees two of them ready
	}
}

// logger is the engine's log: the simulation's debug sink, if any.
func (n *node) logger() *slog.Logger {
	if n.s.debug == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(debugWriter{n.s, n.name}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type debugWriter struct {
	s    *Sim
	name string
}

func (w debugWriter) Write(p []byte) (int, error) {
	w.s.debugMu.Lock()
	defer w.s.debugMu.Unlock()
	w.s.debug(fmt.Sprintf("%s %s", w.name, strings.TrimSpace(string(p))))
	return len(p), nil
}

// order lets the node's log writers into its writer one at a time, in the order of what
// they write (logstream.Config.Order): writers that woke together would otherwise reach
// the group commit in the order the Go scheduler ran them.
func (n *node) order(entries []checkpoint.Entry) {
	raw, _ := json.Marshal(entries)
	h := fnv.New64a()
	h.Write(raw)
	in := make(chan struct{})
	n.s.submitAlone(n.name, "write #"+strconv.FormatUint(h.Sum64(), 36), func() { close(in) })
	<-in
}
