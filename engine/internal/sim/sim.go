package sim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/invariants"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// maxEvents bounds one seed's events: a seed takes some thousands; one past this is
// caught in a loop of the simulation's own.
const maxEvents = 400000

// T0 is the simulation's time zero: a bubble's clock starts at 2000-01-01 UTC, and the
// simulation sleeps until this moment before anything starts, so that cron schedules and
// deadlines fall on the dates the workloads expect.
var T0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// Switches turn guards off for the negative controls (TestSimulationControls). The zero
// value is production: every guard on.
type Switches struct {
	// Hooks are the real nodes' switches (internal/base/testhooks): the store's guards,
	// the lease's (NoKillSwitch), the leader's (NoReconcile, NoLeaseRead, ...). The
	// reference store takes them too: it is the same code applying the whole log.
	Hooks *testhooks.Hooks
	// NoWatchdog: a step process is not killed at its lease's trust deadline while its
	// node cannot act (paused); without the containment watchdog (the step's init) it
	// runs on until the node wakes up and its kill switch stops it.
	NoWatchdog bool
}

// priorityAging is the nodes' priority aging (engine.Config.PriorityAging): short, so
// that a seed's queued runs of priority 0 overtake the labelled runs of priority -5 it
// holds back, and are overtaken by those of 5, within its minutes.
const priorityAging = 20 * time.Second

// Config is one simulated cluster and its workload, drawn from the seed (newConfig).
type Config struct {
	Nodes int // flowd nodes
	Slots int // worker slots per node

	TTL               time.Duration // lease and term TTL
	ReconcileInterval time.Duration
	LockDelay         time.Duration

	Runs      int           // runs the client submits
	SubmitIn  time.Duration // over this long
	Cron      bool          // a scheduled workflow fires until CronUntil
	CronUntil time.Duration // the client applies it without its schedule then
	Catchup   string        // its schedule's catch-up policy
	FaultsFor time.Duration // faults happen until then, none after
	Settle    time.Duration // liveness: every run ends within this after the faults stop
	StepMax   time.Duration // a step attempt takes up to this long
	StepFail  float64       // an attempt fails with this probability
	Loss      float64       // a message on a node's link is lost (while faults last)
	SlowP     float64       // a message takes a slow path (while faults last)
	DupP      float64       // an acknowledged log publish is appended again later
	// RedeliverP: a task fetched is delivered again within 300ms, before its ack wait
	// (JetStream's at-least-once: an ack lost or late, a consumer's leader change). Drawn
	// from a stream of its own (Sim.redeliver), so that seeds without it run as before.
	RedeliverP float64
	// KeyedRuns are runs of the workflow "keyed" (concurrency: one run per account at a
	// once), over two accounts, some cancelled while they run. Drawn from a stream of
	// their own (Sim.keyed), in half the seeds.
	KeyedRuns int
	// SignalStarts are runs s1.. of the workflow "wait" started by signal-with-start
	// (issue 39): one to three callers each, racing, with one signal ID or their own.
	// Drawn from a stream of their own (Sim.signalStart), in half the seeds.
	SignalStarts int
	// Events are messages e1.. on the trigger of the workflow "ledger" (issue 39's on:),
	// each published one to three times (a publisher's retries: the same data, so the
	// same run ID, at sequences of their own), each copy delivered to any live node, as a
	// deposed or a new leader's consumer would take it. Drawn from a stream of their own
	// (Sim.event), in half the seeds (invariant "event").
	Events int
	// LabelledRuns are runs f1.. of the workflow "fin", whose step b needs the worker
	// label finance (runs_on), which only node FinanceNode has (flowd --labels): they
	// wait while it is down, and no step of theirs runs elsewhere (invariant "label").
	// Drawn from a stream of their own (Sim.label), in half the seeds.
	LabelledRuns int
	FinanceNode  int
	// RatedRuns are runs w1.. of the workflow "wallet", whose foreach step pay has
	// rate_limit {key: simwallet, limit: WalletLimit, per: 1s}: started together, they
	// run on several nodes at once, and no second of the simulation sees more pay starts
	// than the rate allows (invariant "rate"). Drawn from a stream of their own (Sim.rate),
	// in half the seeds.
	RatedRuns int
	// Skew is each node's clock offset from the simulation's (its clockwork clock's
	// readings; durations are the same).
	Skew       []time.Duration
	Partitions int // fault counts
	Pauses     int
	Kills      int
	Drains     int
	Slows      int // a node's events run late (CPU starvation) for a while
	LogCuts    int // a node reaches the buckets but not the log for a while

	// The cluster version (engine/internal/gate). OldNode is the index of a node that
	// reads log formats up to 1 only, a release before the cluster version's (-1: none);
	// Upgrade, if set, is when it is restarted reading format 2. Hold: an operator's
	// hold keeps the version at 1 from the start until the client releases it at
	// Release (the raise: the leader raises it if every member reads format 2).
	OldNode int
	Upgrade time.Duration
	Hold    bool
	Release time.Duration

	Switches Switches
}

// newConfig draws a cluster, a workload and its faults from rng.
func newConfig(rng *rand.Rand, sw Switches) Config {
	ttl := []time.Duration{2 * time.Second, 3 * time.Second, 5 * time.Second}[rng.IntN(3)]
	c := Config{
		Nodes:             3,
		Slots:             1 + rng.IntN(2),
		TTL:               ttl,
		ReconcileInterval: []time.Duration{time.Second, 2 * time.Second}[rng.IntN(2)],
		Runs:              3 + rng.IntN(6),
		SubmitIn:          time.Duration(5+rng.IntN(15)) * time.Second,
		Cron:              rng.IntN(3) == 0,
		CronUntil:         time.Duration(10+rng.IntN(15)) * time.Second,
		Catchup:           []string{"all", "latest", "none"}[rng.IntN(3)],
		FaultsFor:         time.Duration(20+rng.IntN(20)) * time.Second,
		Settle:            120 * time.Second,
		StepMax:           time.Duration(200+rng.IntN(2000)) * time.Millisecond,
		StepFail:          []float64{0, 0.05, 0.15}[rng.IntN(3)],
		Loss:              []float64{0, 0.01, 0.03, 0.1}[rng.IntN(4)],
		SlowP:             []float64{0, 0.02, 0.1}[rng.IntN(3)],
		DupP:              []float64{0, 0, 0.02, 0.1}[rng.IntN(4)],
		Partitions:        rng.IntN(4),
		Pauses:            rng.IntN(4),
		Kills:             rng.IntN(3),
		Drains:            rng.IntN(3),
		Slows:             rng.IntN(2),
		LogCuts:           rng.IntN(3),
		Switches:          sw,
	}
	for i := 0; i < c.Nodes; i++ {
		var skew time.Duration
		if rng.IntN(3) == 0 {
			skew = time.Duration(rng.Int64N(int64(2*ttl))) - ttl
		}
		c.Skew = append(c.Skew, skew)
	}
	if rng.IntN(4) == 0 {
		c.LockDelay = ttl / 2
	}
	if rng.IntN(4) == 0 {
		c.StepMax = 2 * ttl // long steps: a paused node's step outlives its trust window
	}
	c.OldNode = -1
	if rng.IntN(3) == 0 {
		c.OldNode = rng.IntN(c.Nodes)
		if rng.IntN(2) == 0 {
			c.Upgrade = time.Second + time.Duration(rng.Int64N(int64(c.FaultsFor)))
		}
	}
	if c.Hold = rng.IntN(2) == 0; c.Hold {
		c.Release = time.Duration(rng.Int64N(int64(c.FaultsFor)))
	}
	return c
}

// Sim is one simulated cluster driven by one seed.
type Sim struct {
	seed uint64
	cfg  Config
	rng  *rand.Rand
	// redeliver draws the task redeliveries (Config.RedeliverP): apart from rng, so that
	// a seed without them draws everything else as it did before they came.
	redeliver *rand.Rand
	// keyed draws the runs of one concurrency key (Config.KeyedRuns, client.go's
	// submitKeyed), apart from rng too: a seed without them runs as before they came.
	keyed *rand.Rand
	keyOf map[string]string // a keyed run's key (invariant "key")
	// keyStep is a slotted run's keyed step: it holds its key only there.
	keyStep map[string]string
	// signalStart draws the signal-with-start runs (Config.SignalStarts); signalStarted
	// are those a call said it started or signalled (invariant "sws").
	signalStart   *rand.Rand
	signalStarted map[string]bool
	// event draws the messages of the trigger (Config.Events); eventSettled are those a
	// delivery said started or found their run (invariant "event").
	event        *rand.Rand
	eventSettled map[int]bool
	// label draws the runs that need a worker label (Config.LabelledRuns); finRuns are
	// their IDs (invariant "label").
	label   *rand.Rand
	finRuns map[string]bool
	// rate draws the rate-limited runs (Config.RatedRuns); walletRuns are their IDs and
	// payStarts the moments their pay processes started (invariant "rate").
	rate       *rand.Rand
	walletRuns map[string]bool
	payStarts  []time.Time
	now        time.Time

	in     inbox
	q      eventQueue
	qseq   uint64
	steps  int       // events handled
	spinAt time.Time // the moment of the last rounds of submissions, and how many
	spins  int

	srv   *server
	nodes []*node
	lives []*life // every incarnation's engine: the bubble ends when all have stopped
	cl    *simClient

	ref     *checkpoint.Store   // the whole log, applied as it is appended
	check   *invariants.Checker // follows the reference
	failure *Failure            // the first broken invariant
	trace   func(line string)   // nil: no trace
	debug   func(line string)   // nil: the engines' own logs go nowhere
	debugMu sync.Mutex          // debug is called from the engines' goroutines
	// traceCalls puts every submission the loop handles in the trace (TraceCalls).
	traceCalls bool
	stats      Stats // what the seed exercised
	faultOn    bool  // faults may still happen
	finished   bool  // every run ended and every node caught up
	// closing: the seed has ended and shutdown stops the engines; every call still
	// open, and every call made from now on, is answered errDead at once.
	closing  bool
	open     map[*pcall]struct{} // calls sent and not answered yet
	terms    map[int64]bool      // the terms of accepted entries (Stats.Terms)
	handlers map[string]bool     // the handler runs seen (Stats.Handlers)
	alarms   map[string]bool     // the runs that sleep until a time (Stats.UntilWakes)
	calls    int                 // calls sent so far
}

// Stats count what one seed exercised.
type Stats struct {
	Events, Messages                          int
	Partitions, Pauses, Kills, Drains, Lost   int
	Slows, Dups, LogCuts, Redeliveries        int
	Terms, Assigns, Reclaims, Fenced, Stale   int
	SideEffects, Commits, DeadLettered, Ticks int
	Succeeded, Failed, Cancelled              int
	// The third round's features, as the log's accepted entries show them.
	Parks, Wakes, Signals, Decisions, Children int
	Handlers, Cancels, Retries, RetriesFrom    int
	DeadlinesMissed, Backfilled, CronPauses    int
	Watchdogs                                  int
	// DeadLetterHandlers: on_dead_letter handler runs; UntilWakes: wakes of sleeps with
	// `until`. Raises: cluster versions raised; RaisesRefused: releases of the hold the
	// gate refused (a member reads format 1 only); Upgrades: that member restarted
	// reading format 2.
	DeadLetterHandlers, UntilWakes  int
	StopCancels                     int // keyed runs cancelled while their owner was paused mid-step
	Raises, RaisesRefused, Upgrades int
	// SquatsRefused: runs a person tried to start under a child's ID, refused.
	SquatsRefused int
	// SignalStarts: runs that signal-with-start started (or signalled) and that hold
	// their signal from their first sequence (invariant "sws").
	SignalStarts int
	// TriggerRuns: messages that started their run, exactly one (invariant "event");
	// TriggerDeliveries: the deliveries of them all, the copies and retries included.
	TriggerRuns, TriggerDeliveries int
	// LabelledSteps: step processes of runs that need the finance label, each on the
	// finance node (invariant "label").
	LabelledSteps int
	// PaySteps: rate-limited step processes (invariant "rate").
	PaySteps int
	// SlotGrants: the leader's grants of a slotted run's step slots (invariant "key").
	SlotGrants int
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
	s := &Sim{seed: seed, rng: rng, now: T0, check: invariants.New(), faultOn: true,
		open: map[*pcall]struct{}{}, terms: map[int64]bool{}, handlers: map[string]bool{}, alarms: map[string]bool{}}
	s.cfg = newConfig(rng, sw)
	s.redeliver = rand.New(rand.NewPCG(seed^0x5bd1e9955bd1e995, seed))
	s.cfg.RedeliverP = []float64{0, 0, 0.05, 0.2}[s.redeliver.IntN(4)]
	s.keyed = rand.New(rand.NewPCG(seed^0x7f4a7c159e3779b9, seed))
	s.cfg.KeyedRuns = []int{0, 0, 4, 8}[s.keyed.IntN(4)]
	// A key's runs go one at a time: liveness allows for them one after the other (two
	// steps of up to StepMax each, over two accounts), beside the rest of the workload.
	// Seed 1992 (8 keyed runs, one worker a node, every step up to 10 s) ended its last
	// keyed run 150 s after the faults, progressing all along.
	s.cfg.Settle += time.Duration(s.cfg.KeyedRuns) * s.cfg.StepMax
	s.keyOf = map[string]string{}
	s.keyStep = map[string]string{}
	s.signalStart = rand.New(rand.NewPCG(seed^0x2545f4914f6cdd1d, seed))
	s.cfg.SignalStarts = []int{0, 0, 1, 2}[s.signalStart.IntN(4)]
	s.signalStarted = map[string]bool{}
	s.event = rand.New(rand.NewPCG(seed^0x94d049bb133111eb, seed))
	s.cfg.Events = []int{0, 0, 1, 3}[s.event.IntN(4)]
	s.eventSettled = map[int]bool{}
	s.label = rand.New(rand.NewPCG(seed^0xbf58476d1ce4e5b9, seed))
	s.cfg.LabelledRuns = []int{0, 0, 2, 4}[s.label.IntN(4)]
	s.cfg.FinanceNode = s.label.IntN(s.cfg.Nodes)
	if s.cfg.OldNode >= 0 && s.cfg.Upgrade == 0 {
		// An old node never upgraded keeps the cluster version at 1, and runs_on needs 3.
		s.cfg.LabelledRuns = 0
	}
	// One node runs them all: liveness allows for them one after the other.
	s.cfg.Settle += time.Duration(s.cfg.LabelledRuns) * 2 * s.cfg.StepMax
	s.finRuns = map[string]bool{}
	s.rate = rand.New(rand.NewPCG(seed^0xd6e8feb86659fd93, seed))
	s.cfg.RatedRuns = []int{0, 0, 3, 5}[s.rate.IntN(4)]
	if s.cfg.OldNode >= 0 && s.cfg.Upgrade == 0 {
		s.cfg.RatedRuns = 0 // rate_limit needs cluster version 3 too
	}
	// Their pays go at the wallet's rate, one after the other.
	s.cfg.Settle += time.Duration(s.cfg.RatedRuns*walletItems) * time.Second / walletLimit
	s.walletRuns = map[string]bool{}
	return s
}

// Trace sets where the event trace goes, one line per event (nil: nowhere). The trace is
// the simulation's own account (messages appended and their verdicts, faults, side
// effects): the same seed gives the same trace.
func (s *Sim) Trace(fn func(line string)) { s.trace = fn }

// TraceCalls puts every submission the loop handles in the trace: what tells where two
// runs of one seed part (TestSimulationIsDeterministic).
func (s *Sim) TraceCalls() { s.traceCalls = true }

// Debug sets where the engines' own logs go (nil: nowhere). Their goroutines log in the
// order the Go scheduler ran them: unlike the trace, this is not a replay.
func (s *Sim) Debug(fn func(line string)) { s.debug = fn }

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

func fmtOffset(d time.Duration) string { return fmt.Sprintf("%.4fs", d.Seconds()) }

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

// Run runs the seed to its end in a synctest bubble of t's: every run ended and every
// live node caught up (nil), or the first broken invariant (a *Failure). Every goroutine
// the cluster started has ended when it returns (the bubble waits for them).
func (s *Sim) Run(t *testing.T) (err error) {
	synctest.Test(t, func(*testing.T) {
		err = s.run()
	})
	return err
}

func (s *Sim) run() error {
	s.in.kick = make(chan struct{}, 1)
	time.Sleep(time.Until(T0)) // the bubble's clock to the simulation's time zero
	s.now = time.Now()
	if err := s.start(); err != nil {
		s.shutdown()
		if s.ref != nil {
			s.ref.Close()
		}
		return err
	}
	s.loop()
	s.stats.Events = s.steps
	s.shutdown()
	defer s.ref.Close()
	if s.failure != nil {
		return s.failure
	}
	return s.final()
}
