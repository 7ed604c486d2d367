package supervise

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/testkit/within"
)

// These tests move a fake clock: the supervisor's silence ticker, its restart timer and
// the parts' own waits are the clock's waiters, and each step waits (with a deadline) for
// the waiters it expects before it moves the clock. Nothing sleeps to synchronise.

// blockUntil waits, for at most 5 s of real time, until clk has n waiters.
func blockUntil(t *testing.T, clk *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("the clock never had %d waiters: %v", n, err)
	}
}

// statusOf is the named part's status (ok false if it is not listed).
func statusOf(s *Supervisor, name string) (Status, bool) {
	for _, st := range s.Status() {
		if st.Name == name {
			return st, true
		}
	}
	return Status{}, false
}

// A part that reports progress more often than its silence limit is never restarted,
// however long its whole work takes: a watch replaying a large bucket's initial values on
// a loaded machine, or an applier catching up, hears something every moment it moves.
// (Issue 37: a lease watcher restarted 35 times in a row, "silent for 1.2s", its replay
// never finishing.)
func TestAPartThatReportsProgressSlowlyIsNeverRestarted(t *testing.T) {
	const silence = time.Second
	clk := clockwork.NewFakeClock()
	s := New(quiet(), WithClock(clk))
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs, progress atomic.Int32
	const steps = 40 // 40 steps of 0.9 s: a replay 36 silence limits long
	s.Go(ctx, Part{Name: "replay", Silence: silence, Run: func(ctx context.Context, alive func()) error {
		runs.Add(1)
		for range steps {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-clk.After(silence * 9 / 10): // one slow entry
			}
			alive()
			progress.Add(1)
		}
		<-ctx.Done()
		return nil
	}})
	for i := range steps {
		blockUntil(t, clk, 2) // the supervisor's ticker and the part's wait
		clk.Advance(silence * 9 / 10)
		waitUntil(t, "the part's progress", func() bool { return progress.Load() == int32(i+1) })
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs = %d, want 1: a part that reported progress within its limit was restarted", n)
	}
	if st, _ := statusOf(s, "replay"); !st.Healthy || st.Restarts != 0 || st.InARow != 0 {
		t.Fatalf("status %+v, want healthy and never restarted", st)
	}
}

// A part that is really silent is restarted, and each restart in a row waits longer
// (exponential, up to the cap); a run that then works for ResetAfter starts the backoff
// again from its base.
func TestConsecutiveRestartsBackOffAndAHealthyRunResetsThem(t *testing.T) {
	const silence = time.Second
	pol := backoff.Policy{Base: time.Second, Cap: 4 * time.Second, NoJitter: true}
	clk := clockwork.NewFakeClock()
	s := New(quiet(), WithClock(clk), WithBackoff(pol))
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	p := Part{Name: "watch", Silence: silence}
	resetAfter := s.ResetAfter(p)
	if resetAfter != 8*time.Second { // max(2 × 1s silence, 2 × 4s cap)
		t.Fatalf("ResetAfter = %s, want 8s", resetAfter)
	}
	const healthyRun = 6 // this run works (alive every 0.5 s) for ResetAfter, then falls silent
	var runs atomic.Int32
	var healthyDone atomic.Bool
	causes := make(chan error, 16)
	p.Run = func(ctx context.Context, alive func()) error {
		n := runs.Add(1)
		alive()
		if n == healthyRun {
			for elapsed := time.Duration(0); elapsed < resetAfter; elapsed += silence / 2 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-clk.After(silence / 2):
				}
				alive()
			}
			healthyDone.Store(true)
		}
		<-ctx.Done() // silent: only the supervisor ends it
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
	s.Go(ctx, p)
	// silentStop makes run n silent past its limit and waits until it is stopped.
	silentStop := func(n int32) Status {
		t.Helper()
		waitUntil(t, fmt.Sprintf("run %d", n), func() bool { return runs.Load() == n })
		blockUntil(t, clk, 1) // the silence ticker
		clk.Advance(silence + silence/4)
		select {
		case c := <-causes:
			if !errors.Is(c, ErrSilent) {
				t.Fatalf("run %d ended by %v, want ErrSilent", n, c)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d was not stopped for its silence", n)
		}
		var st Status
		waitUntil(t, "the part stopped, waiting to restart", func() bool {
			st, _ = statusOf(s, "watch")
			return !st.RestartAt.IsZero()
		})
		return st
	}
	// restartAfter checks that the stopped part waits exactly want, then is restarted.
	restartAfter := func(st Status, n int32, want time.Duration) {
		t.Helper()
		if got := st.RestartAt.Sub(clk.Now()); got != want {
			t.Fatalf("restart %d in a row waits %s, want %s", st.InARow, got, want)
		}
		blockUntil(t, clk, 1) // the restart timer
		clk.Advance(want - time.Millisecond)
		if runs.Load() != n {
			t.Fatalf("the part was started again before its backoff of %s", want)
		}
		clk.Advance(time.Millisecond)
		waitUntil(t, fmt.Sprintf("run %d", n+1), func() bool { return runs.Load() == n+1 })
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		n := int32(i + 1)
		st := silentStop(n)
		if st.Healthy || st.InARow != i+1 || !strings.Contains(st.LastReason, "silent") ||
			!strings.Contains(st.Problem, fmt.Sprintf("restart %d in a row", i+1)) {
			t.Fatalf("status after silent run %d: %+v", n, st)
		}
		restartAfter(st, n, want)
	}
	// Run 5 is silent as well: the backoff stays at the cap.
	restartAfter(silentStop(5), 5, 4*time.Second)
	// Run 6 works for ResetAfter before it falls silent: the backoff starts again.
	waitUntil(t, "run 6", func() bool { return runs.Load() == healthyRun })
	for elapsed := time.Duration(0); elapsed < resetAfter; elapsed += silence / 2 {
		blockUntil(t, clk, 2) // the silence ticker and the part's wait
		clk.Advance(silence / 2)
	}
	waitUntil(t, "the healthy run's end", healthyDone.Load)
	if st, _ := statusOf(s, "watch"); st.InARow != 0 || !st.Healthy {
		t.Fatalf("after a healthy run of %s the status is %+v, want healthy, 0 in a row", resetAfter, st)
	}
	st := silentStop(healthyRun)
	if st.InARow != 1 {
		t.Fatalf("after a healthy run, the restart is %d in a row, want 1", st.InARow)
	}
	restartAfter(st, healthyRun, time.Second)
	if st, _ := statusOf(s, "watch"); st.Restarts != healthyRun {
		t.Fatalf("restarts %d, want %d", st.Restarts, healthyRun)
	}
}

// Restarts are counted per part (and kept when a part of the same name is started anew),
// and the last reason a part stopped is kept and said by Problems.
func TestRestartsAreCountedPerPartWithTheLastReason(t *testing.T) {
	clk := clockwork.NewFakeClock()
	s := New(quiet(), WithClock(clk), WithBackoff(backoff.Policy{Base: time.Second, Cap: time.Second, NoJitter: true}))
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs atomic.Int32
	s.Go(ctx, Part{Name: "flaky", Run: func(ctx context.Context, alive func()) error {
		n := runs.Add(1)
		if n <= 3 {
			return fmt.Errorf("watch closed (%d)", n)
		}
		alive()
		<-ctx.Done()
		return nil
	}})
	s.Go(ctx, Part{Name: "steady", Run: func(ctx context.Context, alive func()) error {
		alive()
		<-ctx.Done()
		return nil
	}})
	// The steady part is running before its absence from the problems is asserted: on a
	// busy machine its goroutine once had not started yet ("steady: not running").
	waitUntil(t, "steady running", func() bool { st, _ := statusOf(s, "steady"); return st.Healthy })
	for n := int32(1); n <= 3; n++ {
		// Run n stopped, and waits for the clock to be moved: its status holds still.
		want := fmt.Sprintf("watch closed (%d)", n)
		var st Status
		waitUntil(t, fmt.Sprintf("run %d stopped", n), func() bool {
			st, _ = statusOf(s, "flaky")
			return st.LastReason == want && !st.RestartAt.IsZero()
		})
		if runs.Load() != n || st.InARow != int(n) {
			t.Fatalf("runs %d, status %+v; want run %d, %d in a row", runs.Load(), st, n, n)
		}
		problems := strings.Join(s.Problems(), "; ")
		if !strings.Contains(problems, "flaky: stopped ("+want+"); restart "+fmt.Sprint(n)+" in a row in 1s") ||
			strings.Contains(problems, "steady") {
			t.Fatalf("problems %q: want flaky's reason and count, nothing of steady", problems)
		}
		blockUntil(t, clk, 1)
		clk.Advance(time.Second)
	}
	waitUntil(t, "flaky running", func() bool { return runs.Load() == 4 && len(s.Problems()) == 0 })
	if got := s.RestartsByPart(); got["flaky"] != 3 || got["steady"] != 0 || s.Restarts() != 3 {
		t.Fatalf("restarts by part %v (total %d), want flaky 3, steady 0", got, s.Restarts())
	}
	if st, _ := statusOf(s, "flaky"); st.Restarts != 3 || st.LastReason != "watch closed (3)" {
		t.Fatalf("flaky's status %+v", st)
	}
	// A part of the same name started anew (the lease watcher of a new term) adds to
	// the same count.
	ctx2, cancel2 := context.WithCancel(ctx)
	var again atomic.Int32
	done := s.Go(ctx2, Part{Name: "flaky", Run: func(ctx context.Context, alive func()) error {
		if again.Add(1) == 1 {
			return errors.New("watch closed (again)")
		}
		<-ctx.Done()
		return nil
	}})
	blockUntil(t, clk, 1)
	clk.Advance(time.Second)
	waitUntil(t, "the new part's second run", func() bool { return again.Load() == 2 })
	cancel2()
	within.Do(t, 10*time.Second, func() { <-done }, "the new part to end")
	if got := s.RestartsByPart()["flaky"]; got != 4 {
		t.Fatalf("flaky restarts %d, want 4 (3 and 1)", got)
	}
}
