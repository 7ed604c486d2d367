package rates

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/workflow"
)

// Cell is a key's entry in the bucket.
type Cell struct {
	// TAT is the theoretical arrival time: the next start may go from it on.
	TAT time.Time `json:"tat"`
	// Limit and Per are the rate of the start that wrote it (for `flowctl limits`).
	Limit int           `json:"limit"`
	Per   time.Duration `json:"per"`
}

// Slack is how late after its reserved moment a start may still go: min(100ms, per/10).
func Slack(r workflow.RateLimit) time.Duration {
	return min(100*time.Millisecond, time.Duration(r.Per)/10)
}

// Waiter is one start waiting for its moment on this node.
type Waiter struct {
	Run   string    `json:"run"`
	Step  string    `json:"step"`
	Item  int       `json:"item"`
	Key   string    `json:"key"`
	Since time.Time `json:"since"`
}

// Stats count a limiter's work per key, for metrics.
type Stats struct {
	Starts    atomic.Int64 // starts that went
	Late      atomic.Int64 // reservations given up because the start woke past its slack
	Conflicts atomic.Int64 // reservations made again because another start's came first
	WaitNanos atomic.Int64 // time starts waited for their moment
}

// Config of a Limiter.
type Config struct {
	KV     port.KV // the FLOW_RATES bucket
	Clock  clockwork.Clock
	Logger *slog.Logger
	// Local makes each node pace alone, in its memory: the control that shows what the
	// shared bucket prevents (a cluster of n nodes goes n times the rate).
	Local bool
}

// Limiter reserves starts for this node's steps.
type Limiter struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger

	mu      sync.Mutex
	waiters map[*Waiter]bool
	stats   map[string]*Stats
	local   map[string]time.Time // Local: each key's TAT in this node's memory
}

// New returns a limiter over cfg.KV.
func New(cfg Config) *Limiter {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Limiter{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, waiters: map[*Waiter]bool{}, stats: map[string]*Stats{}, local: map[string]time.Time{}}
}

// StatsOf returns key's counters (made on first use).
func (l *Limiter) StatsOf(key string) *Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats[key]
	if s == nil {
		s = &Stats{}
		l.stats[key] = s
	}
	return s
}

// Keys are the keys this limiter has paced, sorted.
func (l *Limiter) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := make([]string, 0, len(l.stats))
	for k := range l.stats {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Waiters are the starts waiting on this node now, oldest first.
func (l *Limiter) Waiters() []Waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Waiter, 0, len(l.waiters))
	for w := range l.waiters {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b Waiter) int { return a.Since.Compare(b.Since) })
	return out
}

// Next is the moment a start reserved now would get, given a key's cell: max(TAT, now).
func Next(c Cell, now time.Time) time.Time {
	if c.TAT.After(now) {
		return c.TAT
	}
	return now
}

// Reserve takes the key's next moment: it returns when the start may go. Conflicts
// with other nodes' reservations are retried at once; any other failure with backoff,
// until ctx ends.
func (l *Limiter) Reserve(ctx context.Context, r workflow.RateLimit) (time.Time, error) {
	st := l.StatsOf(r.Key)
	if l.cfg.Local {
		l.mu.Lock()
		defer l.mu.Unlock()
		at := Next(Cell{TAT: l.local[r.Key]}, l.clock.Now())
		l.local[r.Key] = at.Add(r.Interval())
		return at, nil
	}
	for attempt := 0; ; attempt++ {
		at, err := l.reserveOnce(ctx, r)
		switch {
		case err == nil:
			return at, nil
		case ctx.Err() != nil:
			return time.Time{}, context.Cause(ctx)
		case errors.Is(err, port.ErrWrongRevision) || errors.Is(err, port.ErrKeyExists):
			st.Conflicts.Add(1)
			continue
		}
		l.log.Warn("rate limit: reservation failed; trying again", "key", r.Key, "err", err)
		select {
		case <-ctx.Done():
			return time.Time{}, context.Cause(ctx)
		case <-l.clock.After(backoff.Policy{Base: 20 * time.Millisecond, Cap: time.Second}.Delay(min(attempt, 10))):
		}
	}
}

func (l *Limiter) reserveOnce(ctx context.Context, r workflow.RateLimit) (time.Time, error) {
	var cell Cell
	e, err := l.cfg.KV.Latest(ctx, r.Key)
	switch {
	case errors.Is(err, port.ErrKeyNotFound):
	case err != nil:
		return time.Time{}, err
	case e.Op == port.OpPut:
		if err := json.Unmarshal(e.Value, &cell); err != nil {
			// A broken cell paces from now: the write below mends it.
			l.log.Warn("rate limit: the key's cell is unreadable; pacing from now", "key", r.Key, "err", err)
			cell = Cell{}
		}
	}
	at := Next(cell, l.clock.Now())
	next, err := json.Marshal(Cell{TAT: at.Add(r.Interval()), Limit: r.Limit, Per: time.Duration(r.Per)})
	if err != nil {
		return time.Time{}, err
	}
	if e.Revision == 0 {
		_, err = l.cfg.KV.Create(ctx, r.Key, next)
	} else {
		_, err = l.cfg.KV.Update(ctx, r.Key, next, e.Revision)
	}
	return at, err
}

// Wait reserves a moment for w's start and waits for it; it returns nil when the start
// may go now (within the slack of its moment). A start that woke later reserves again.
// ctx's end (the epoch's) ends the wait with its cause.
func (l *Limiter) Wait(ctx context.Context, r workflow.RateLimit, w Waiter) error {
	w.Key = r.Key
	w.Since = l.clock.Now()
	l.mu.Lock()
	l.waiters[&w] = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiters, &w)
		l.mu.Unlock()
	}()
	st := l.StatsOf(r.Key)
	defer func() { st.WaitNanos.Add(int64(l.clock.Since(w.Since))) }()
	for {
		at, err := l.Reserve(ctx, r)
		if err != nil {
			return err
		}
		if d := at.Sub(l.clock.Now()); d > 0 {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-l.clock.After(d):
			}
		}
		if late := l.clock.Since(at); late > Slack(r) {
			st.Late.Add(1)
			l.log.Info("rate limit: woke past the reserved moment; reserving again", "key", r.Key, "late", late)
			continue
		}
		st.Starts.Add(1)
		return nil
	}
}

// Rate is a key as the bucket has it, for `flowctl limits`.
type Rate struct {
	Key   string
	Limit int
	Per   time.Duration
	// Reserved counts the starts reserved and not yet due: (TAT-now)/interval.
	Reserved int
	// Next is when a start reserved now would go.
	Next time.Time
}

// List reads every key's cell.
func (l *Limiter) List(ctx context.Context) ([]Rate, error) {
	keys, err := l.cfg.KV.Keys(ctx)
	if err != nil && !errors.Is(err, port.ErrKeyNotFound) {
		return nil, fmt.Errorf("rates: list keys: %w", err)
	}
	now := l.clock.Now()
	var out []Rate
	for _, k := range keys {
		e, err := l.cfg.KV.Get(ctx, k)
		if err != nil {
			continue // gone since
		}
		var c Cell
		if json.Unmarshal(e.Value, &c) != nil || c.Limit <= 0 || c.Per <= 0 {
			continue
		}
		r := Rate{Key: k, Limit: c.Limit, Per: c.Per, Next: Next(c, now)}
		if ahead := c.TAT.Sub(now); ahead > 0 {
			r.Reserved = int(ahead / (c.Per / time.Duration(c.Limit)))
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rate) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}
