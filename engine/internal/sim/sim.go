package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/invariants"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// maxEvents bounds one seed's events: a seed takes some thousands; one past this is
// caught in a loop of the simulation's own.
const maxEvents = 200000

// T0 is the simulation's time zero: every clock starts here.
var T0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// Switches turn guards off for the negative controls (TestSimulationControls). The zero
// value is production: every guard on.
type Switches struct {
	// Hooks are the store's guards (NoEpochCheck, NoCheckpointCheck, NoStartCheck,
	// NoTermCheck, NoClaimOnceCheck) and the lease's (NoKillSwitch), as the real nodes
	// take them. The reference store takes them too: it is the same code applying the
	// whole log.
	Hooks *testhooks.Hooks
	// NoWatchdog: a step process is not killed at its lease's trust deadline while its
	// node cannot act (paused); without issue 24's containment watchdog it runs on
	// until the node wakes up and its kill switch stops it.
	NoWatchdog bool
	// NoReconcile: the leader never runs a reconcile pass (lost tasks and missed lapses
	// are never made good).
	NoReconcile bool
	// NoTrustCheck: a worker writes (commits) without checking its lease's trust first;
	// the log's epoch check is then all that fences a zombie.
	NoTrustCheck bool
	// LapseIgnoresOwner: a lapsed lease reclaims its epoch whoever owns the run (the
	// leader's rule before the simulation found seed 192; leader.Reclaimable).
	LapseIgnoresOwner bool
	// ReconcileOnStaleWatch: the reconcile reclaims on the word of a lease watch that is
	// not current (the leader's rule before the simulation found seed 300).
	ReconcileOnStaleWatch bool
	// NoLeaseRead: a reclaim does not read the run's lease from the server first (the
	// leader's rule before the simulation found seed 1255).
	NoLeaseRead bool
}

func (s Switches) hooks() *testhooks.Hooks { return testhooks.OrProduction(s.Hooks) }

// Config is one simulated cluster and its workload, drawn from the seed (newConfig).
type Config struct {
	Nodes int // flowd nodes
	Slots int // worker slots per node

	TTL               time.Duration // lease and term TTL
	ReconcileInterval time.Duration
	LockDelay         time.Duration
	QueueAhead        int // admission: runs assigned ahead of the workers

	Runs       int           // runs the client submits
	SubmitIn   time.Duration // over this long
	Cron       bool          // a scheduled workflow fires until CronUntil
	CronUntil  time.Duration // the client applies it without its schedule then
	FaultsFor  time.Duration // faults happen until then, none after
	Settle     time.Duration // liveness: every run ends within this after the faults stop
	StepMax    time.Duration // a step attempt takes up to this long
	StepFail   float64       // an attempt fails with this probability
	Loss       float64       // a message on a node's link is lost (while faults last)
	SlowP      float64       // a message takes a slow path (while faults last)
	DupP       float64       // an acknowledged log publish is appended again later
	Partitions int           // fault counts
	Pauses     int
	Kills      int
	Drains     int

	Switches Switches
}

// lease is the LeaseClock of the simulated cluster.
func (c *Config) lease() epoch.LeaseClock {
	return epoch.Config{TTL: c.TTL, AllowShortTTL: true}.LeaseClock()
}

// newConfig draws a cluster, a workload and its faults from rng.
func newConfig(rng *rand.Rand, sw Switches) Config {
	ttl := []time.Duration{2 * time.Second, 3 * time.Second, 5 * time.Second}[rng.IntN(3)]
	c := Config{
		Nodes:             3,
		Slots:             1 + rng.IntN(2),
		TTL:               ttl,
		ReconcileInterval: []time.Duration{time.Second, 2 * time.Second}[rng.IntN(2)],
		QueueAhead:        2 + rng.IntN(3),
		Runs:              3 + rng.IntN(6),
		SubmitIn:          time.Duration(5+rng.IntN(15)) * time.Second,
		Cron:              rng.IntN(3) == 0,
		CronUntil:         time.Duration(10+rng.IntN(15)) * time.Second,
		FaultsFor:         time.Duration(20+rng.IntN(20)) * time.Second,
		Settle:            90 * time.Second,
		StepMax:           time.Duration(200+rng.IntN(2000)) * time.Millisecond,
		StepFail:          []float64{0, 0.05, 0.15}[rng.IntN(3)],
		Loss:              []float64{0, 0.01, 0.03, 0.1}[rng.IntN(4)],
		SlowP:             []float64{0, 0.02, 0.1}[rng.IntN(3)],
		DupP:              []float64{0, 0, 0.02, 0.1}[rng.IntN(4)],
		Partitions:        rng.IntN(4),
		Pauses:            rng.IntN(4),
		Kills:             rng.IntN(3),
		Drains:            rng.IntN(3),
		Switches:          sw,
	}
	if rng.IntN(4) == 0 {
		c.LockDelay = ttl / 2
	}
	if rng.IntN(4) == 0 {
		c.StepMax = 2 * ttl // long steps: a paused node's step outlives its trust window
	}
	return c
}

// event is one thing that happens at a time: a delivery, a timer, a process's act.
type event struct {
	at   time.Time
	seq  uint64 // insertion order breaks ties: the order is total
	node *node  // nil: the server's or the world's; else held while the node is paused
	inc  int    // the node's incarnation that scheduled it: dropped once it was killed
	proc bool   // a step process's event: not held by a pause (the process is not paused)
	fn   func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

// Sim is one simulated cluster driven by one seed. It is single-threaded: Run handles
// one event at a time, in (time, insertion) order, and every random choice comes from
// one generator seeded by the seed, so a seed is a replay.
type Sim struct {
	seed  uint64
	cfg   Config
	rng   *rand.Rand
	now   time.Time
	q     eventQueue
	qseq  uint64
	steps int // events handled

	srv   *server
	nodes []*node
	cl    *client
	lc    epoch.LeaseClock

	ref      *checkpoint.Store   // the whole log, applied as it is appended
	refVerd  map[uint64][]string // the reference's verdicts by sequence
	check    *invariants.Checker // follows the reference
	specs    *specs.Cache        // of the reference (the client's view)
	failure  *Failure            // the first broken invariant
	trace    func(line string)   // nil: no trace
	stats    Stats               // what the seed exercised
	faultOn  bool                // faults may still happen
	finished bool                // every run ended and every node caught up
}

// Stats count what one seed exercised.
type Stats struct {
	Events, Messages                           int
	Partitions, Pauses, Kills, Drains, Lost    int
	Dups                                       int
	Terms, Assigns, Reclaims, Fenced, Stale    int
	SideEffects, Commits, DeadLettered, Ticks  int
	Succeeded, Failed, Cancelled, KillSwitches int
}

// Failure is a broken invariant, with the time and event it was found at.
type Failure struct {
	Invariant string
	Msg       string
	At        time.Duration
	Event     int
}

func (f *Failure) Error() string {
	return fmt.Sprintf("invariant %s broken at %s (event %d): %s", f.Invariant, f.At, f.Event, f.Msg)
}

// New builds the simulation of seed with the switches sw.
func New(seed uint64, sw Switches) *Sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &Sim{seed: seed, rng: rng, now: T0, refVerd: map[uint64][]string{}, check: invariants.New(), faultOn: true}
	s.cfg = newConfig(rng, sw)
	s.lc = s.cfg.lease()
	return s
}

// Trace sets where the event trace goes, one line per event (nil: nowhere).
func (s *Sim) Trace(fn func(line string)) { s.trace = fn }

// Config is the cluster and workload the seed drew.
func (s *Sim) Config() Config { return s.cfg }

// Stats are what the run exercised.
func (s *Sim) Stats() Stats { return s.stats }

func (s *Sim) tracef(who, format string, args ...any) {
	if s.trace == nil {
		return
	}
	s.trace(fmt.Sprintf("%10s %-4s %s", fmtOffset(s.now.Sub(T0)), who, fmt.Sprintf(format, args...)))
}

func fmtOffset(d time.Duration) string {
	return fmt.Sprintf("%.4fs", d.Seconds())
}

// at schedules fn at t (not before now) as the world's or the server's event.
func (s *Sim) at(t time.Time, fn func()) { s.push(&event{at: t, fn: fn}) }

func (s *Sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

func (s *Sim) push(e *event) {
	if e.at.Before(s.now) {
		e.at = s.now
	}
	s.qseq++
	e.seq = s.qseq
	heap.Push(&s.q, e)
}

// fail records the first broken invariant; the run stops after the current event.
func (s *Sim) fail(inv, format string, args ...any) {
	if s.failure != nil {
		return
	}
	s.failure = &Failure{Invariant: inv, Msg: fmt.Sprintf(format, args...), At: s.now.Sub(T0), Event: s.steps}
	s.tracef("!!", "INVARIANT %s: %s", inv, s.failure.Msg)
}

func (s *Sim) failErr(err error) {
	if v, ok := err.(*invariants.Violation); ok {
		s.fail(v.Invariant, "%s", v.Msg)
		return
	}
	s.fail("sim", "%v", err)
}

// Run runs the seed to its end: every run ended and every live node caught up (nil), or
// the first broken invariant (a *Failure).
func (s *Sim) Run() (err error) {
	defer s.close()
	if err := s.start(); err != nil {
		return err
	}
	for s.failure == nil {
		if len(s.q) == 0 {
			s.fail("sim", "no events left: the simulation stalled")
			break
		}
		e := heap.Pop(&s.q).(*event)
		if e.node != nil {
			n := e.node
			if e.inc != n.inc {
				continue // scheduled by an incarnation that was killed
			}
			if n.paused && !e.proc {
				n.held = append(n.held, e)
				continue
			}
		}
		s.now = e.at
		s.steps++
		if s.steps > maxEvents {
			s.fail("sim", "more than %d events: a loop in the simulation (at %s)", maxEvents, s.now.Sub(T0))
			break
		}
		e.fn()
		if s.done() {
			break
		}
	}
	s.stats.Events = s.steps
	if s.failure != nil {
		return s.failure
	}
	return s.final()
}

func (s *Sim) close() {
	for _, n := range s.nodes {
		n.closeStore()
	}
	if s.ref != nil {
		_ = s.ref.Close()
	}
}

// start opens the stores and schedules the workload and the faults.
func (s *Sim) start() error {
	ref, err := checkpoint.OpenStore("ref", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: s.cfg.Switches.Hooks})
	if err != nil {
		return err
	}
	s.ref = ref
	s.specs = specs.New(ref)
	s.srv = newServer(s)
	for i := 0; i < s.cfg.Nodes; i++ {
		n := newNode(s, i)
		s.nodes = append(s.nodes, n)
		if err := n.boot(); err != nil {
			return err
		}
	}
	s.cl = newClient(s)
	s.cl.start()
	s.scheduleFaults()
	return nil
}
