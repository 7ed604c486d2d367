package epoch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/port"
)

// ErrResigned is the cause of a term's context after Resign.
var ErrResigned = errors.New("epoch: resigned")

// Leader names the current leader. Term 0 means no leader.
type Leader struct {
	Node string `json:"node"`
	Term int64  `json:"term"`
}

// Elector campaigns for the scheduler leadership of one node.
type Elector struct {
	kv     port.KV
	raiser port.TermRaiser
	node   string
	cfg    Config
}

// NewElector campaigns on the leader bucket kv (port.LeaderBucket, whose TTL must be
// cfg's: on JetStream, jsport.LeaderConfig, in file storage, so that the terms keep
// growing across a restart of every NATS server). raiser raises the bucket's terms
// (RaiseTerms; nil: it cannot). It takes its own copy of cfg, with defaults
// (Config.WithDefaults), and validates it.
func NewElector(kv port.KV, raiser port.TermRaiser, node string, cfg Config) (*Elector, error) {
	cfg, err := cfg.ready()
	if err != nil {
		return nil, err
	}
	if node == "" {
		return nil, fmt.Errorf("%w: node ID is empty: pass the node's ID to NewElector", ErrInvalidConfig)
	}
	if kv == nil {
		return nil, fmt.Errorf("%w: the leader bucket is nil", ErrInvalidConfig)
	}
	return &Elector{kv: kv, raiser: raiser, node: node, cfg: cfg}, nil
}

// Term is one won election. Its context is cancelled (with the cause) the moment the
// leadership can no longer be trusted; Check says the same before each write.
type Term struct {
	k    *keeper
	term int64
	node string
}

// Term is the term number: the KV revision at which it was won. Every scheduler entry
// carries it and the log rejects entries of a lower term than it has applied.
func (t *Term) Term() int64 { return t.term }

// Node is the leader's node ID.
func (t *Term) Node() string { return t.node }

// Context is cancelled when the term ends.
func (t *Term) Context() context.Context { return t.k.ctx }

// Done is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.k.ctx.Done() }

// Err is why the term ended (wraps ErrLeaseLost or ErrResigned), nil while it lasts.
func (t *Term) Err() error { return context.Cause(t.k.ctx) }

// Check is the local test before every scheduler write: nil while this node may still
// believe it leads (its trust window, on its monotonic clock, is open). A write that
// slips past it anyway still carries the term, and the log rejects it if stale.
func (t *Term) Check() error {
	if err := t.k.check(); err != nil {
		return fmt.Errorf("%w: term %d: %w", ErrNotLeader, t.term, err)
	}
	return nil
}

// TrustDeadline is when this node stops believing it leads unless a renewal succeeds
// first (see Lease.TrustDeadline).
func (t *Term) TrustDeadline() time.Time { return t.k.trust().Deadline() }

// Resign ends the term and deletes the leader key (if still ours), so that another
// node wins at once instead of after the TTL.
func (t *Term) Resign(ctx context.Context) error {
	return t.k.release(ctx, ErrResigned)
}

type leaderValue struct {
	Node string `json:"node"`
	Term int64  `json:"term,omitempty"`
}

// CampaignOption configures one Campaign.
type CampaignOption func(*campaign)

type campaign struct{ heard func() }

// Heard is called whenever the campaign has heard from the server: a renewal of the
// current leader's key, or the answer to a bid. A supervisor uses it to tell a quiet
// campaign (a healthy leader renewing) from a deaf one (a silent partition).
func Heard(fn func()) CampaignOption { return func(c *campaign) { c.heard = fn } }

// Campaign blocks until this node wins a term, or ctx ends. Losers wait for the key
// to be deleted or to lapse (by the server's marker, or on their own clock when no
// renewal has been seen for a TTL), then retry with capped exponential backoff and
// full jitter. A watch that hears nothing therefore only delays a bid by a TTL; a watch
// that closes ends the campaign with an error (the caller starts a new one).
func (e *Elector) Campaign(ctx context.Context, opts ...CampaignOption) (*Term, error) {
	c := campaign{heard: func() {}}
	for _, o := range opts {
		o(&c)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := e.kv.Watch(wctx, leaderKey)
	if err != nil {
		return nil, fmt.Errorf("epoch: watch the leader key: %w", err)
	}
	defer func() { _ = w.Stop() }()
	lapse := e.cfg.Clock.NewTimer(e.cfg.TTL)
	defer lapse.Stop()
	for attempt := 0; ; attempt++ {
		sent := e.cfg.Clock.Now()
		val, _ := json.Marshal(leaderValue{Node: e.node})
		rev, err := e.kv.Create(ctx, leaderKey, val)
		if err == nil {
			return e.won(ctx, rev, sent), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if isRevisionMismatch(err) {
			c.heard() // the server answered the bid
			if err := e.waitForVacancy(ctx, w, lapse, c.heard); err != nil {
				return nil, err
			}
		} else {
			e.cfg.Logger.Warn("campaign failed; retrying", "err", err)
		}
		if err := sleep(ctx, e.cfg.Clock, e.cfg.Backoff.Delay(min(attempt, 8))); err != nil {
			return nil, err
		}
	}
}

func (e *Elector) won(ctx context.Context, rev uint64, sent time.Time) *Term {
	val, _ := json.Marshal(leaderValue{Node: e.node, Term: int64(rev)})
	t := &Term{term: int64(rev), node: e.node}
	// The term's life is not the campaign's ctx: it ends by Resign or lost trust.
	t.k = newKeeper(context.WithoutCancel(ctx), e.kv, leaderKey, val, rev, sent, &e.cfg,
		fmt.Sprintf("term %d of %s", rev, e.node), true, func() { e.cfg.Counters.TermsLost.Add(1) })
	e.cfg.Counters.TermsWon.Add(1)
	e.cfg.Logger.Info("won leadership", "node", e.node, "term", rev)
	return t
}

// waitForVacancy returns when the leader key was deleted, lapsed (marker), or has not
// been renewed for a TTL on this node's clock.
func (e *Elector) waitForVacancy(ctx context.Context, w port.Watcher, lapse clockwork.Timer, heard func()) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-lapse.Chan():
			lapse.Reset(e.cfg.TTL)
			return nil
		case entry, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("epoch: leader watch closed")
			}
			heard()
			if entry == nil {
				continue // end of the initial value
			}
			if entry.Op != port.OpPut {
				return nil
			}
			if !lapse.Stop() {
				select {
				case <-lapse.Chan():
				default:
				}
			}
			lapse.Reset(e.cfg.TTL)
		}
	}
}

// Leader reads the current leader through the bucket stream's leader.
func (e *Elector) Leader(ctx context.Context) (Leader, error) {
	l, err := readLatest(ctx, e.kv, leaderKey)
	if err != nil || !l.found || l.deleted {
		return Leader{}, err
	}
	return parseLeader(l.value, l.rev), nil
}

func parseLeader(value []byte, rev uint64) Leader {
	var v leaderValue
	_ = json.Unmarshal(value, &v)
	if v.Term == 0 {
		v.Term = int64(rev) // the creating write: its revision is the term
	}
	return Leader(v)
}

// Observe streams leader changes (Term 0: none) until ctx ends, then closes the
// channel. The goroutine it starts is owned by ctx.
func (e *Elector) Observe(ctx context.Context) (<-chan Leader, error) {
	w, err := e.kv.Watch(ctx, leaderKey)
	if err != nil {
		return nil, fmt.Errorf("epoch: watch the leader key: %w", err)
	}
	out := make(chan Leader, 8)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		last := Leader{Term: -1}
		for {
			select {
			case <-ctx.Done():
				return
			case entry, ok := <-w.Updates():
				if !ok {
					return
				}
				if entry == nil {
					continue
				}
				cur := Leader{}
				if entry.Op == port.OpPut {
					cur = parseLeader(entry.Value, entry.Revision)
				}
				if cur == last {
					continue // a renewal
				}
				last = cur
				select {
				case out <- cur:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// MaxTerm is the highest term RaiseTerms can reach: terms are the leader bucket's
// revisions, and a term above it (a forged entry's) cannot be outgrown.
const MaxTerm = 1 << 53

// RaiseTerms makes every term won from now on greater than above: it purges the leader
// bucket's stream up to above+1, so that its next revision, the next term, is above+1.
// It ends the term held now, whoever holds it (its key is purged): call it only when
// that term can do nothing anyway, because the log has applied a higher one (a leader
// bucket that was reset, whose revisions restarted at 1).
func (e *Elector) RaiseTerms(ctx context.Context, above int64) error {
	if above < 0 || above >= MaxTerm {
		return fmt.Errorf("%w: terms cannot be raised above %d (at most %d): the log holds a term no leader bucket reaches; see docs/operations.md, \"Leader terms\"", ErrTermOutOfReach, above, int64(MaxTerm))
	}
	if e.raiser == nil {
		return fmt.Errorf("epoch: raise terms above %d: this node has no way to (no admin path)", above)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return e.raiser.RaiseTerms(ctx, above)
}
