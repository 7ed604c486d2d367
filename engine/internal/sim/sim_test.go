package sim

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	seedsFlag = flag.Int("sim.seeds", 0, "how many seeds TestSimulation runs (0: the default, fewer under -race)")
	seedFlag  = flag.Uint64("sim.seed", 0, "replay exactly this seed, printing its event trace")
	firstFlag = flag.Uint64("sim.first", 1, "the first seed TestSimulation runs")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
		var b strings.Builder
		s := New(*seedFlag, Switches{})
		s.Trace(func(line string) { b.WriteString(line); b.WriteByte('\n') })
		err := s.Run()
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
	start := time.Now()
	var total Stats
	for seed := *firstFlag; seed < *firstFlag+uint64(n); seed++ {
		s := New(seed, Switches{})
		err := s.Run()
		add(&total, s.Stats())
		if err != nil {
			t.Fatalf("seed %d: %v\nreplay: go test ./engine/internal/sim -run 'TestSimulation$' -sim.seed=%d -v", seed, err, seed)
		}
	}
	el := time.Since(start)
	t.Logf("%d seeds in %s (%.0f seeds/s): %+v", n, el.Round(time.Millisecond), float64(n)/el.Seconds(), total)
}

func add(t *Stats, s Stats) {
	t.Events += s.Events
	t.Messages += s.Messages
	t.Partitions += s.Partitions
	t.Pauses += s.Pauses
	t.Kills += s.Kills
	t.Drains += s.Drains
	t.Lost += s.Lost
	t.Dups += s.Dups
	t.Terms += s.Terms
	t.Assigns += s.Assigns
	t.Reclaims += s.Reclaims
	t.Fenced += s.Fenced
	t.Stale += s.Stale
	t.SideEffects += s.SideEffects
	t.Commits += s.Commits
	t.DeadLettered += s.DeadLettered
	t.Ticks += s.Ticks
	t.Succeeded += s.Succeeded
	t.Failed += s.Failed
	t.Cancelled += s.Cancelled
	t.KillSwitches += s.KillSwitches
}

var _ = fmt.Sprint
var _ = os.Stdout
