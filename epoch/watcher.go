package epoch

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
// server's TTL or by this watcher's own monotonic clock, never by comparing the
// holder's wall clock with ours.
type LeaseWatcher struct {
	ls     *Leases
	events chan LeaseEvent
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	live  map[string]watched
	ready chan struct{} // closed once the initial values were read
}

type watched struct {
	value LeaseValue
	seen  time.Time // when this watcher last saw it written (monotonic)
}

// Watch starts a LeaseWatcher. Stop it.
func (ls *Leases) Watch(ctx context.Context) (*LeaseWatcher, error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := ls.kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("epoch: watch leases: %w", err)
	}
	lw := &LeaseWatcher{ls: ls, events: make(chan LeaseEvent, 1024), cancel: cancel,
		done: make(chan struct{}), live: map[string]watched{}, ready: make(chan struct{})}
	go lw.run(ctx, w)
	return lw, nil
}

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

// Stop stops the watcher and waits for its goroutine. Safe to call twice.
func (lw *LeaseWatcher) Stop() {
	lw.cancel()
	<-lw.done
}

func (lw *LeaseWatcher) run(ctx context.Context, w jetstream.KeyWatcher) {
	defer close(lw.done)
	defer func() { _ = w.Stop() }()
	ttl := lw.ls.cfg.TTL
	grace := ttl + lw.ls.cfg.RenewInterval
	sweep := time.NewTicker(max(ttl/4, 10*time.Millisecond))
	defer sweep.Stop()
	readyClosed := false
	for {
		select {
		case <-ctx.Done():
			return
		case entry, ok := <-w.Updates():
			if !ok {
				return
			}
			if entry == nil {
				if !readyClosed {
					close(lw.ready)
					readyClosed = true
				}
				continue
			}
			run := entry.Key()
			if entry.Operation() == jetstream.KeyValuePut {
				var v LeaseValue
				if json.Unmarshal(entry.Value(), &v) == nil {
					lw.mu.Lock()
					lw.live[run] = watched{value: v, seen: time.Now()}
					lw.mu.Unlock()
				}
				continue
			}
			kind := LeaseReleased
			if entry.Operation() == jetstream.KeyValuePurge {
				kind = LeaseLapsed // the server's TTL marker
			}
			lw.end(ctx, run, kind)
		case <-sweep.C:
			lw.mu.Lock()
			var lapsed []string
			for run, w := range lw.live {
				if time.Since(w.seen) > grace {
					lapsed = append(lapsed, run)
				}
			}
			lw.mu.Unlock()
			for _, run := range lapsed {
				lw.end(ctx, run, LeaseLapsed)
			}
		}
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
