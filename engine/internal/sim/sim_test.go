package sim

import (
	"flag"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/testhooks"
)

var (
	seedsFlag   = flag.Int("sim.seeds", 0, "how many seeds TestSimulation runs (0: the default, fewer under -race)")
	seedFlag    = flag.Uint64("sim.seed", 0, "replay exactly this seed, printing its event trace")
	firstFlag   = flag.Uint64("sim.first", 1, "the first seed TestSimulation runs")
	rescanFlag  = flag.Bool("sim.rescan", false, "TestSimulationControls scans every control from seed 1 (to renew the table of docs/testing.md)")
	controlFlag = flag.String("sim.control", "", "TestSimulationControls runs only this control")
	callsFlag   = flag.Bool("sim.calls", false, "with -sim.seed, trace every call the simulation handles")
	debugFlag   = flag.Bool("sim.debug", false, "with -sim.seed, print the engines' own logs too (not a replay: their goroutines' order)")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The worker's take-once rule (worker.Pool.take, Hooks.TakeTwice) is not among the
// controls: its damage needs a task delivered twice to one node while the epoch's first
// execution ends in a way that frees its lease, and the seeds that showed it (932, 273,
// 1424, 193, each on its day) did not show it again on another machine (replay is not
// exact), nor did 1,000 seeds with task redeliveries drawn (docs/testing.md).
//
// regressionSeeds broke an invariant once with the workload and faults of their day: 273,
// a node that ran one epoch twice when its task was delivered twice (found as seed 932
// before the log-cut fault moved the seeds; the second execution did a side effect after
// the run had moved to a newer epoch; worker.Pool.take, control "an epoch taken twice"),
// and 1424, where that control found it once the workload drew alarms, dead-letter
// handlers and the cluster version.
var regressionSeeds = []uint64{273, 1424}

func defaultSeeds() int {
	if raceEnabled {
		return 30
	}
	return 300
}

// TestSimulation runs many seeds, each a cluster of three nodes with its own workload
// and faults, checking the invariants after every event; -sim.seed=S replays one seed
// and prints its trace.
func TestSimulation(t *testing.T) {
	if *seedFlag != 0 {
		// The trace goes out as it is written: a seed that never ends (or whose
		// engines do not stop) shows how far it came.
		var b strings.Builder
		sw := Switches{}
		for _, c := range controls {
			if c.name == *controlFlag {
				sw = c.sw // -sim.control: replay the seed with that guard off
			}
		}
		s := New(*seedFlag, sw)
		s.Trace(func(line string) { fmt.Println(line) })
		if *callsFlag {
			s.TraceCalls()
		}
		if *debugFlag {
			s.Debug(func(line string) { b.WriteString("        debug " + line + "\n") })
		}
		err := s.Run(t)
		t.Logf("seed %d: %+v\n%s", *seedFlag, s.Config(), b.String())
		t.Logf("stats: %+v", s.Stats())
		if err != nil {
			t.Fatalf("seed %d: %v", *seedFlag, err)
		}
		return
	}
	n := *seedsFlag
	if n == 0 {
		n = defaultSeeds()
	}
	// Seeds that once broke an invariant (docs/testing.md says how): each runs first.
	for _, seed := range regressionSeeds {
		if err := New(seed, Switches{}).Run(t); err != nil {
			t.Fatalf("regression seed %d: %v\nreplay: go test ./engine/internal/sim -run 'TestSimulation$' -sim.seed=%d -v", seed, err, seed)
		}
	}
	start := time.Now()
	seed, total, err := runSeeds(t, *firstFlag, n, Switches{})
	el := time.Since(start)
	if err != nil {
		t.Fatalf("seed %d: %v\n%s\nreplay: go test ./engine/internal/sim -run 'TestSimulation$' -sim.seed=%d -v", seed, err, reproduce(t, seed, err), seed)
	}
	t.Logf("%d seeds in %s (%.0f seeds/s): %+v", n, el.Round(time.Millisecond), float64(n)/el.Seconds(), total)
	if n >= 300 {
		if idle := unexercised(total); len(idle) > 0 {
			t.Fatalf("%d seeds never exercised %v: the workload or the faults lost a feature", n, idle)
		}
	}
}

// unexercised names the Stats counters that are zero: each counts a feature, a fault or
// an outcome the default seeds must exercise (parks, signals, wakes, decisions,
// children, handlers, cancels, retries, backfills, missed deadlines, fencing, kills...).
func unexercised(st Stats) []string {
	var idle []string
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		if v.Field(i).Int() == 0 {
			idle = append(idle, v.Type().Field(i).Name)
		}
	}
	return idle
}

// reproduce runs a failed seed again, up to 5 times, and says how often it failed the
// same way: a seed is a replay in most but not all runs (TestSimulationIsDeterministic).
func reproduce(t *testing.T, seed uint64, err error) string {
	again := 0
	for range 5 {
		if e := New(seed, Switches{}).Run(t); e != nil && e.Error() == err.Error() {
			again++
		}
	}
	return fmt.Sprintf("run again 5 times, the seed failed the same way %d times", again)
}

// runSeeds runs seeds first, first+1, ... (n of them) on GOMAXPROCS goroutines, each
// seed a simulation of its own, and returns the lowest seed that failed, with its error
// (0, nil if none did), and the stats of the seeds run. Seeds are handed out in order
// and none above a failure is started, so the lowest failing seed is the same whatever
// the goroutines' timing.
func runSeeds(t *testing.T, first uint64, n int, sw Switches) (uint64, Stats, error) {
	var (
		mu      sync.Mutex
		next    = first
		failed  uint64
		failErr error
		total   Stats
		wg      sync.WaitGroup
	)
	end := first + uint64(n)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				seed := next
				if seed >= end || (failErr != nil && seed > failed) {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				s := New(seed, sw)
				err := s.Run(t)
				mu.Lock()
				add(&total, s.Stats())
				if err != nil && (failErr == nil || seed < failed) {
					failed, failErr = seed, err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed, total, failErr
}

// add adds s's counters to t's.
func add(t *Stats, s Stats) {
	tv, sv := reflect.ValueOf(t).Elem(), reflect.ValueOf(s)
	for i := range tv.NumField() {
		tv.Field(i).SetInt(tv.Field(i).Int() + sv.Field(i).Int())
	}
}

// TestSimulationIsDeterministic: a seed is (almost always) a replay. The simulation runs
// the real services in a testing/synctest bubble: time is the bubble's and the loop
// handles what the goroutines submit in a fixed order, but the Go scheduler still
// picks among ready select cases and goroutines woken together, so a few seeds in a
// hundred take another path now and then (docs/decisions.md: measured 88 of 100 seeds
// replayed exactly, twice each). The test holds that line with room to spare: of
// replaySeeds seeds run twice, at least minReplays give the identical trace, event for
// event; and two different seeds give different traces.
func TestSimulationIsDeterministic(t *testing.T) {
	const replaySeeds, minReplays = 30, 18
	trace := func(seed uint64) (string, error) {
		var b strings.Builder
		s := New(seed, Switches{})
		s.Trace(func(line string) { b.WriteString(line); b.WriteByte('\n') })
		err := s.Run(t)
		return b.String(), err
	}
	same := 0
	var differ []string
	for seed := uint64(1); seed <= replaySeeds; seed++ {
		a, _ := trace(seed)
		b, _ := trace(seed)
		if strings.Count(a, "\n") < 20 {
			t.Fatalf("seed %d: a trace of %d lines", seed, strings.Count(a, "\n"))
		}
		if a == b {
			same++
		} else {
			differ = append(differ, fmt.Sprintf("seed %d: %s", seed, firstDiff(a, b)))
		}
	}
	t.Logf("%d of %d seeds replayed exactly", same, replaySeeds)
	if same < minReplays {
		t.Fatalf("only %d of %d seeds replayed exactly (want %d); where they parted:\n%s", same, replaySeeds, minReplays, strings.Join(differ, "\n"))
	}
	a, _ := trace(7)
	b, _ := trace(8)
	if a == b {
		t.Fatalf("seeds 7 and 8 gave the same trace")
	}
}

// control is a guard switched off, and the invariants whose break shows the damage it
// prevents.
type control struct {
	name  string
	sw    Switches
	want  []string // any one of these invariants
	first uint64   // the first seed that breaks it (docs/testing.md): the scan starts there
}

var controls = []control{
	{"no epoch check", Switches{Hooks: &testhooks.Hooks{NoEpochCheck: true}}, []string{"2"}, 65},
	{"no checkpoint check", Switches{Hooks: &testhooks.Hooks{NoCheckpointCheck: true}}, []string{"1", "3"}, 22},
	{"no start check", Switches{Hooks: &testhooks.Hooks{NoStartCheck: true}}, []string{"3", "1"}, 33},
	{"no term check", Switches{Hooks: &testhooks.Hooks{NoTermCheck: true}}, []string{"term"}, 65},
	{"no claim-once check", Switches{Hooks: &testhooks.Hooks{NoClaimOnceCheck: true}}, []string{"8"}, 36},
	{"no kill switch", Switches{Hooks: &testhooks.Hooks{NoKillSwitch: true}}, []string{"8"}, 14},
	{"no containment watchdog", Switches{NoWatchdog: true}, []string{"8", "key"}, 173},
	{"no reconcile", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoReconcile.Store(true) })}, []string{"liveness"}, 1},
	{"no lease read", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoLeaseRead.Store(true) })}, []string{"8"}, 15},
	{"no lease read, lapse ignores owner", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoLeaseRead.Store(true); h.LapseIgnoresOwner.Store(true) })}, []string{"8"}, 15},
	{"no lease read, reconcile on a stale watch", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoLeaseRead.Store(true); h.ReconcileOnStaleWatch.Store(true) })}, []string{"8"}, 15},
	{"no consume-once", Switches{Hooks: &testhooks.Hooks{NoConsumeOnce: true}}, []string{"11"}, 3},
	{"no early signals", Switches{Hooks: &testhooks.Hooks{NoEarlySignals: true}}, []string{"11"}, 1},
	{"no signal dedup", Switches{Hooks: &testhooks.Hooks{NoSignalDedup: true}}, []string{"11"}, 1},
	{"no cancel cascade", Switches{Hooks: &testhooks.Hooks{NoCancelCascade: true}}, []string{"cascade"}, 7},
	{"no deadline check", Switches{Hooks: &testhooks.Hooks{NoDeadlineCheck: true}}, []string{"deadline"}, 272},
	{"no decision check", Switches{Hooks: &testhooks.Hooks{NoDecisionCheck: true}}, []string{"approval"}, 287},
	{"no inputs-by exclude", Switches{Hooks: &testhooks.Hooks{NoInputsByExclude: true}}, []string{"approval"}, 57},
	{"no park check", Switches{Hooks: &testhooks.Hooks{NoParkCheck: true}}, []string{"timer"}, 264},
	{"no handler once", Switches{Hooks: &testhooks.Hooks{NoHandlerOnce: true}}, []string{"handler"}, 28},
	{"no child binding", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoChildBinding.Store(true) })}, []string{"child"}, 11},
	{"random child IDs", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.RandomChildIDs.Store(true) })}, []string{"11"}, 4},
	{"gate ignores roster", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.GateIgnoresRoster.Store(true) })}, []string{"gate", "liveness"}, 1},
	{"no slot drain", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoSlotDrain.Store(true) })}, []string{"key"}, 212},
	{"signal-start apart", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.SignalStartApart.Store(true) })}, []string{"sws"}, 1},
	{"trigger ID per delivery", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.TriggerIDPerDelivery.Store(true) })}, []string{"event"}, 3},
	{"labels off", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.LabelsOff.Store(true) })}, []string{"label"}, 5},
	{"rates local", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.RatesLocal.Store(true) })}, []string{"rate"}, 2},
	{"no step slots", Switches{Hooks: hooks(func(h *testhooks.Hooks) { h.NoStepSlots.Store(true) })}, []string{"key"}, 48},
	{"no step drain", Switches{Hooks: &testhooks.Hooks{NoStepDrain: true}}, []string{"key"}, 409},
}

// hooks is a Hooks with set applied: the engine-level switches are atomics, set once
// before the seed starts.
func hooks(set func(*testhooks.Hooks)) *testhooks.Hooks {
	h := new(testhooks.Hooks)
	set(h)
	return h
}

// controlSeeds bounds the seeds a control may try before it must have failed.
const controlSeeds = 1000

// TestSimulationControls: with each guard off, some seed breaks the invariant the guard
// keeps. A control that finds nothing within controlSeeds seeds fails the test: the
// simulation could not tell the guard is needed. Each scan starts at the first failing
// seed docs/testing.md lists (-sim.rescan: from seed 1, to renew the table), so that the
// controls take seconds; the seed found is logged. -sim.control=NAME runs one. Under
// -race they are skipped (thousands of seeds): CI runs them without it (.ci/run).
func TestSimulationControls(t *testing.T) {
	if raceEnabled {
		t.Skip("the controls scan thousands of seeds: run without -race (.ci/run does)")
	}
	for _, c := range controls {
		if *controlFlag != "" && c.name != *controlFlag {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			from := c.first
			if *rescanFlag || from == 0 {
				from = 1
			}
			seed, _, err := runSeeds(t, from, controlSeeds, c.sw)
			if err == nil {
				t.Fatalf("with %s no seed of %d from %d broke %v: the guard is not shown to matter", c.name, controlSeeds, from, c.want)
			}
			if seed != c.first {
				t.Logf("the first failing seed moved: %d (docs/testing.md's table says %d)", seed, c.first)
			}
			f, ok := err.(*Failure)
			if !ok {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if !slices.Contains(c.want, f.Invariant) {
				t.Fatalf("with %s, seed %d broke invariant %s, not %v: %v\nreplay: go test ./engine/internal/sim -run 'TestSimulationControls' -sim.control=%q -v",
					c.name, seed, f.Invariant, c.want, err, c.name)
			}
			t.Logf("with %s: seed %d breaks invariant %s: %s", c.name, seed, f.Invariant, f.Msg)
		})
	}
}
