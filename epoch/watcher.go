package epoch

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
)

// LeaseEventKind says how a lease ended.
type LeaseEventKind string

// Lease event kinds.
const (
	// LeaseLapsed: the holder stopped renewing; seen as the server's TTL marker, or as
	// no renewal for a TTL (plus a renewal interval of slack) on the watcher's clock.
	LeaseLapsed LeaseEventKind = "lapsed"
	// LeaseReleased: the holder deleted the key (done, or draining).
	LeaseReleased LeaseEventKind = "released"
)

// LeaseEvent is a lease that ended.
type LeaseEvent struct {
	Kind  LeaseEventKind
	Lease LeaseValue
}

// LeaseWatcher is the leader's view of every run lease. Expiry is judged by the
// server's TTL or by this watcher's own monotonic clock (Config.Clock), never by
// comparing the holder's wall clock with ours. Its KV watch is a supervised part
// ("lease-watcher"): a watch that closes, or hears nothing while the bucket moves on,
// is replaced.
type LeaseWatcher struct {
	ls     *Leases
	events chan LeaseEvent
	cancel context.CancelFunc
	done   <-chan struct{}

	mu        sync.Mutex
	live      map[string]watched
	ready     chan struct{} // closed once the initial values were read
	readyDone bool
	current   time.Time // when the watch last showed it was caught up with the bucket
	// asOf is the time the watch was last shown caught up *as of*: the moment the probe
	// that it caught up with was sent (current is when that was seen). Every lease
	// written before asOf has been delivered (CaughtUpAsOf).
	asOf time.Time
}

type watched struct {
	value LeaseValue
	seen  time.Time // when this watcher last saw it written (monotonic)
}

// Watch starts a LeaseWatcher. Stop it.
func (ls *Leases) Watch(ctx context.Context) (*LeaseWatcher, error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	lw := &LeaseWatcher{ls: ls, events: make(chan LeaseEvent, 1024), cancel: cancel,
		live: map[string]watched{}, ready: make(chan struct{})}
	sup := ls.cfg.Supervisor
	if sup == nil {
		sup = supervise.New(supervise.WithLogger(ls.cfg.Logger))
	}
	lw.done = sup.Go(ctx, supervise.Part{Name: "lease-watcher", Silence: ls.cfg.WatchSilence(), Run: lw.run})
	return lw, nil
}

// WatchSilence is how long the lease watcher may hear nothing before its supervisor
// replaces the watch: two TTLs, and at least 4s (the engine's other parts' floor).
// Healthy, it hears far more often: every renewal within a renewal interval (TTL/3), and
// an idle bucket shown current by a round trip every TTL/4. The limit is not one TTL
// because a new watch first replays every lease, and on a loaded machine that replay
// (and the round trip that makes the watch) can take longer than a TTL: restarted at
// one TTL, the watcher was replaced 35 times in a row and never finished.
// The room costs no safety: a watch that is not shown current judges no lapse
// (Current, sweep), so a deaf watch only delays lapses, by this limit at most.
func (c Config) WatchSilence() time.Duration { return max(2*c.TTL, 4*time.Second) }

// Events delivers ended leases. Read it: the watcher blocks when it is full.
func (lw *LeaseWatcher) Events() <-chan LeaseEvent { return lw.events }

// Ready is closed once the watcher has read every lease that existed when it started.
func (lw *LeaseWatcher) Ready() <-chan struct{} { return lw.ready }

// Live returns the lease of run if this watcher believes it is held.
func (lw *LeaseWatcher) Live(run string) (LeaseValue, bool) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	w, ok := lw.live[run]
	return w.value, ok
}

// Current reports whether the watch has shown, within a renewal interval, that it is
// caught up with the bucket (the sweep's own rule). Only then does Live tell a lease that
// lapsed from one this watcher has not heard of yet: a watch that lags (its replies lost
// or late) misses every lease taken since it fell behind, and a reconcile acting on its
// word would take a run from a live owner (found by the deterministic simulation,
// engine/internal/sim; docs/testing.md).
func (lw *LeaseWatcher) Current() bool {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.readyDone && lw.ls.cfg.Clock.Now().Sub(lw.current) <= lw.ls.cfg.RenewInterval
}

// CaughtUpAsOf is the latest time as of which this watch is known to have delivered
// every lease write: a lease written before it is in Live unless it ended since. Zero
// until the initial values were read. The leader frees a concurrency key's slot only
// once this passed the moment it saw the slot's run end (engine/internal/leader keys.go):
// the run's lease was written before its end, so a watch caught up as of later has it.
func (lw *LeaseWatcher) CaughtUpAsOf() time.Time {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.asOf
}

// LiveRuns are the runs whose lease this watcher believes held, sorted.
func (lw *LeaseWatcher) LiveRuns() []string {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	out := make([]string, 0, len(lw.live))
	for run := range lw.live {
		out = append(out, run)
	}
	slices.Sort(out)
	return out
}

// Stop stops the watcher and waits for its goroutines. Safe to call twice.
func (lw *LeaseWatcher) Stop() {
	lw.cancel()
	<-lw.done
}

// run is one life of the watch: from a new KV watch (which delivers every lease's
// latest value first) until ctx ends or the watch closes.
func (lw *LeaseWatcher) run(ctx context.Context, alive func()) error {
	w, err := lw.ls.kv.Watch(ctx, "")
	if err != nil {
		return fmt.Errorf("epoch: watch leases: %w", err)
	}
	defer func() { _ = w.Stop() }()
	alive() // the watch was made: a round trip that worked, before any replay
	clk := lw.ls.cfg.Clock
	ttl := lw.ls.cfg.TTL
	grace := lw.ls.cfg.leaseClock().LapseAfter()
	sweep := clk.NewTicker(max(ttl/4, 10*time.Millisecond))
	defer sweep.Stop()
	var seenRev uint64 // the highest revision this watch delivered
	var target uint64  // the bucket's last revision at the last probe
	var targetAt time.Time
	watchAt := clk.Now() // the initial values are as of the watch's making, or later
	initial := true
	markCurrent := func(asOf time.Time) {
		lw.mu.Lock()
		lw.current = clk.Now()
		if asOf.After(lw.asOf) {
			lw.asOf = asOf
		}
		lw.mu.Unlock()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case entry, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("epoch: lease watch closed")
			}
			alive() // progress: while it replays the initial values too, entry by entry
			if entry == nil {
				initial = false
				lw.mu.Lock()
				lw.current = clk.Now()
				if watchAt.After(lw.asOf) {
					lw.asOf = watchAt
				}
				if !lw.readyDone {
					close(lw.ready)
					lw.readyDone = true
				}
				lw.mu.Unlock()
				continue
			}
			seenRev = max(seenRev, entry.Revision)
			if !initial && seenRev >= target {
				markCurrent(targetAt)
			}
			run := entry.Key
			if entry.Op == port.OpPut {
				var v LeaseValue
				if json.Unmarshal(entry.Value, &v) == nil {
					lw.mu.Lock()
					lw.live[run] = watched{value: v, seen: clk.Now()}
					lw.mu.Unlock()
				}
				continue
			}
			kind := LeaseReleased
			if entry.Op == port.OpPurge {
				kind = LeaseLapsed // the server's TTL marker
			}
			lw.end(ctx, run, kind)
		case <-sweep.Chan():
			if initial {
				continue
			}
			// Is this watch current? The bucket's last revision against what it
			// delivered: a watch that is behind (or deaf) must not judge lapses by its
			// own clock, or every lease would look lapsed while it hears nothing.
			probeAt := clk.Now()
			pctx, cancel := withClockDeadline(ctx, clk, probeAt.Add(max(ttl/4, 100*time.Millisecond)))
			last, err := lw.ls.kv.LastRevision(pctx)
			cancel()
			if err == nil {
				target, targetAt = last, probeAt
				if target <= seenRev {
					alive()
					markCurrent(probeAt)
				}
			}
			lw.sweep(ctx, clk.Now(), grace)
		}
	}
}

// sweep reports leases not seen renewed for grace at now, while the watch is current.
func (lw *LeaseWatcher) sweep(ctx context.Context, now time.Time, grace time.Duration) {
	lw.mu.Lock()
	if now.Sub(lw.current) > lw.ls.cfg.RenewInterval {
		lw.mu.Unlock()
		return
	}
	var lapsed []string
	for run, w := range lw.live {
		if now.Sub(w.seen) > grace {
			lapsed = append(lapsed, run)
		}
	}
	lw.mu.Unlock()
	slices.Sort(lapsed) // reported in the runs' order, not the map's
	for _, run := range lapsed {
		lw.end(ctx, run, LeaseLapsed)
	}
}

func (lw *LeaseWatcher) end(ctx context.Context, run string, kind LeaseEventKind) {
	lw.mu.Lock()
	w, ok := lw.live[run]
	delete(lw.live, run)
	lw.mu.Unlock()
	if !ok {
		return // already reported, or never seen
	}
	select {
	case lw.events <- LeaseEvent{Kind: kind, Lease: w.value}:
	case <-ctx.Done():
	}
}
