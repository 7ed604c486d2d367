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

// Cell is a key's entry in the bucket. Its moments are on the server's clock: the
// entry's own Created stamp (port.Entry) is the reservation's "now", so that no node's
// clock takes part (a node whose clock is off reserves as well as any other).
type Cell struct {
	// Base is the theoretical arrival time the writer read (TAT of the entry before).
	Base time.Time `json:"base"`
	// Limit and Per are the writer's rate: its interval is Per/Limit.
	Limit int           `json:"limit"`
	Per   time.Duration `json:"per"`
}

// At is the moment the entry's writer reserved: max(Base, created), created its write's
// time on the server.
func (c Cell) At(created time.Time) time.Time {
	if c.Base.After(created) {
		return c.Base
	}
	return created
}

// TAT is the next start's earliest moment after the entry: its writer's moment plus its
// interval.
func (c Cell) TAT(created time.Time) time.Time {
	if c.Limit <= 0 || c.Per <= 0 {
		return time.Time{}
	}
	return c.At(created).Add(c.Per / time.Duration(c.Limit))
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
	// Attempt tells a step's attempts apart (not reported).
	Attempt int `json:"-"`
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

// reservation is a moment reserved: At on the server's clock (this node's in Local
// mode); Wait is how long after Taken (this node's clock, when the write was
// acknowledged) that is.
type reservation struct {
	At    time.Time
	Taken time.Time
	Wait  time.Duration
	// RTT is the write's round trip: the server stamped it up to that long before Taken,
	// so a start that goes Wait after Taken may be that much past its moment.
	RTT time.Duration
}

// Reserve takes the key's next moment. Conflicts with other nodes' reservations are
// retried at once; any other failure with backoff, until ctx ends.
func (l *Limiter) Reserve(ctx context.Context, r workflow.RateLimit) (reservation, error) {
	st := l.StatsOf(r.Key)
	if l.cfg.Local {
		l.mu.Lock()
		defer l.mu.Unlock()
		now := l.clock.Now()
		at := Cell{Base: l.local[r.Key]}.At(now)
		l.local[r.Key] = at.Add(r.Interval())
		return reservation{At: at, Taken: now, Wait: at.Sub(now)}, nil
	}
	for attempt := 0; ; attempt++ {
		res, err := l.reserveOnce(ctx, r)
		switch {
		case err == nil:
			return res, nil
		case ctx.Err() != nil:
			return reservation{}, context.Cause(ctx)
		case errors.Is(err, errOvertaken) || errors.Is(err, port.ErrWrongRevision) || errors.Is(err, port.ErrKeyExists):
			st.Conflicts.Add(1)
			continue
		}
		l.log.Warn("rate limit: reservation failed; trying again", "key", r.Key, "err", err)
		select {
		case <-ctx.Done():
			return reservation{}, context.Cause(ctx)
		case <-l.clock.After(backoff.Policy{Base: 20 * time.Millisecond, Cap: time.Second}.Delay(min(attempt, 10))):
		}
	}
}

// errOvertaken: so many reservations were written after this one's before its
// read-back that the bucket no longer keeps it (History); its moment (which needs its
// own write's stamp) is not known, and it is given up (a gap: never a start too many).
var errOvertaken = errors.New("rates: overtaken before the read-back")

// reserveOnce reads the key's entry, writes the next one on its revision (its Base the
// read entry's TAT), and reads its own write back for the server's stamp.
func (l *Limiter) reserveOnce(ctx context.Context, r workflow.RateLimit) (reservation, error) {
	var base time.Time
	e, err := l.cfg.KV.Latest(ctx, r.Key)
	switch {
	case errors.Is(err, port.ErrKeyNotFound):
	case err != nil:
		return reservation{}, err
	case e.Op == port.OpPut:
		var c Cell
		if err := json.Unmarshal(e.Value, &c); err != nil {
			// A broken cell paces from now: the write below mends it.
			l.log.Warn("rate limit: the key's cell is unreadable; pacing from now", "key", r.Key, "err", err)
		} else {
			base = c.TAT(e.Created)
		}
	}
	next := Cell{Base: base.UTC(), Limit: r.Limit, Per: time.Duration(r.Per)}
	raw, err := json.Marshal(next)
	if err != nil {
		return reservation{}, err
	}
	var rev uint64
	sent := l.clock.Now()
	if e.Revision == 0 {
		rev, err = l.cfg.KV.Create(ctx, r.Key, raw)
	} else {
		rev, err = l.cfg.KV.Update(ctx, r.Key, raw, e.Revision)
	}
	if err != nil {
		return reservation{}, err
	}
	taken := l.clock.Now()
	mine, err := l.cfg.KV.Revision(ctx, r.Key, rev)
	switch {
	case errors.Is(err, port.ErrKeyNotFound):
		return reservation{}, errOvertaken // gone under later writes: its moment is not known
	case err != nil:
		// Written, and its moment unknown: given up, as a gap.
		return reservation{}, err
	}
	at := next.At(mine.Created)
	return reservation{At: at, Taken: taken, Wait: at.Sub(mine.Created), RTT: taken.Sub(sent)}, nil
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
	ctx = port.WithCallTag(ctx, fmt.Sprintf("%s/%s[%d]#%d", w.Run, w.Step, w.Item, w.Attempt))
	for {
		res, err := l.Reserve(ctx, r)
		if err != nil {
			return err
		}
		due := res.Taken.Add(res.Wait)
		if d := due.Sub(l.clock.Now()); d > 0 {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-l.clock.After(d):
			}
		}
		// Late by as much as it woke after its moment, and by as much as its write's
		// stamp may precede the acknowledgement it counts from.
		if late := max(l.clock.Since(due), 0) + max(res.RTT, 0); late > Slack(r) {
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
	// Reserved counts the starts reserved and not yet due: (TAT-now)/interval, by this
	// node's clock (for people: nothing decides by it).
	Reserved int
	// Next is the key's TAT (on the server's clock): a start reserved now goes then, or
	// at once if it is past.
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
		r := Rate{Key: k, Limit: c.Limit, Per: c.Per, Next: c.TAT(e.Created)}
		if ahead := r.Next.Sub(now); ahead > 0 {
			r.Reserved = int(ahead / (c.Per / time.Duration(c.Limit)))
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rate) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}
