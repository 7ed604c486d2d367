package epoch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// ErrReleased is the cause of a lease's context after Release.
var ErrReleased = errors.New("epoch: lease released")

// LeaseValue is what a lease key holds.
type LeaseValue struct {
	Run   string `json:"run"`
	Epoch int64  `json:"epoch"`
	Owner string `json:"owner"`
}

// Leases opens run leases on one bucket. One per node.
type Leases struct {
	kv  port.KV
	cfg Config
}

// NewLeases takes run leases in the bucket kv (port.LeaseBucket, whose TTL must be
// cfg's). On JetStream it is jsport.LeasesConfig, in memory storage: leases are soft
// state. Epochs come from the log, not from this bucket; if every NATS server restarts,
// the leases vanish, their holders' next renewal fails, and the runs are reclaimed with
// new epochs (fencing makes that safe); the bucket itself is created again (jsport.KV).
// It takes its own copy of cfg, with defaults (Config.WithDefaults), and validates it.
func NewLeases(kv port.KV, cfg Config) (*Leases, error) {
	cfg, err := cfg.ready()
	if err != nil {
		return nil, err
	}
	if kv == nil {
		return nil, fmt.Errorf("%w: the lease bucket is nil", ErrInvalidConfig)
	}
	return &Leases{kv: kv, cfg: cfg}, nil
}

// Config is the configuration in use: the constructor's, with its defaults.
func (ls *Leases) Config() Config { return ls.cfg }

// Lease is a worker's claim on a run at one epoch. Its context is cancelled with cause
// ErrLeaseLost when it cannot be renewed; Check before every commit; Release when done.
type Lease struct {
	k     *keeper
	value LeaseValue
}

// Value is the run, epoch and owner of the lease.
func (l *Lease) Value() LeaseValue { return l.value }

// Context is cancelled when the lease is lost or released.
func (l *Lease) Context() context.Context { return l.k.ctx }

// Done is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.k.ctx.Done() }

// Err is why the lease ended, nil while it holds.
func (l *Lease) Err() error { return context.Cause(l.k.ctx) }

// Check is the local test before a commit: nil while the trust window is open.
func (l *Lease) Check() error { return l.k.check() }

// TrustUntil is when the holder stops trusting the lease unless a renewal succeeds
// first: 2/3 of the TTL after the last successful renewal was sent (Trust.Deadline), on
// the real clock, the moment Check starts failing and the kill switch fires. Each renewal moves
// it on. The server lets another holder in no sooner than a TTL after that send, so
// whatever stops at this moment is stopped before another epoch can begin, even when
// the holder's process is frozen and cannot notice (steps.Input.TrustUntil). Zero when
// the kill switch is switched off (a test's negative control): no deadline then.
func (l *Lease) TrustUntil() time.Time { return l.k.trustDeadline() }

// Degraded reports that the last renewal got no answer in time: the worker should
// take no new work until a renewal succeeds again.
func (l *Lease) Degraded() bool { return l.k.degraded() }

// TrustDeadline is when this holder stops trusting its lease unless a renewal succeeds
// first: 2/3 of the TTL after the last successful renewal was sent (Trust.Deadline).
// Check fails from then on and the lease's context is cancelled. It is on Config.Clock;
// with the real clock the time carries a monotonic reading, so time.Until(deadline) is
// immune to wall-clock jumps. It moves later with each successful renewal and stays put
// between them, so work that must not outlive the lease's trust even while this
// process cannot act (a frozen flowd cannot cancel anything) can be given
// time.Until(TrustDeadline()) as its own limit, extended as the deadline moves. Once the
// lease has ended (lost or released) it is no later than the end.
func (l *Lease) TrustDeadline() time.Time { return l.k.trust().Deadline() }

// Freeze stops the lease's renewals and kill switch for d, as if the process were
// paused (a GC pause, SIGSTOP): for drills (flowctl drill zombie). Afterwards it
// notices at once if its trust window has passed.
func (l *Lease) Freeze(d time.Duration) {
	select {
	case l.k.freeze <- d:
	default:
	}
}

// Release stops renewing and deletes the key (if still this lease's), so that the run
// can be reassigned at once rather than after the TTL.
func (l *Lease) Release(ctx context.Context) error { return l.k.release(ctx, ErrReleased) }

// Acquire takes the lease of run for epoch. If a lease of an older epoch still exists
// (its holder died and the key has not lapsed on the server yet), it retries with
// backoff until ctx ends. A lease of the same epoch held by another owner, or of a
// newer epoch, fails at once with ErrLeaseHeld: this task is obsolete.
func (ls *Leases) Acquire(ctx context.Context, run string, epoch int64, owner string) (*Lease, error) {
	val := LeaseValue{Run: run, Epoch: epoch, Owner: owner}
	raw, _ := json.Marshal(val)
	for attempt := 0; ; attempt++ {
		sent := ls.cfg.Clock.Now()
		rev, err := ls.kv.Create(ctx, run, raw)
		if err == nil {
			return ls.start(ctx, val, raw, rev, sent), nil
		}
		if errors.Is(err, port.ErrInvalidKey) {
			return nil, fmt.Errorf("%w: %q", ErrInvalidRun, run)
		}
		if !isRevisionMismatch(err) {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("epoch: acquire lease of %s: %w", run, ctx.Err())
			}
			ls.cfg.Logger.Warn("lease acquire failed; retrying", "run", run, "err", err)
		} else {
			cur, err := readLatest(ctx, ls.kv, run)
			if err != nil {
				return nil, err
			}
			if cur.found && !cur.deleted {
				var held LeaseValue
				if json.Unmarshal(cur.value, &held) == nil {
					switch {
					case held == val:
						// Ours already (a retried acquire): adopt it by renewing it. The
						// create that wrote it was sent at some unknown earlier time, and
						// trust must begin no later than the send of the write the
						// server's TTL runs from: this renewal's.
						sent := ls.cfg.Clock.Now()
						if rev, err := ls.kv.Update(ctx, run, raw, cur.rev); err == nil {
							return ls.start(ctx, val, raw, rev, sent), nil
						}
						// It moved meanwhile: look again after the backoff.
					case held.Epoch >= epoch:
						return nil, fmt.Errorf("%w: run %s: %s holds epoch %d, this task is for epoch %d", ErrLeaseHeld, run, held.Owner, held.Epoch, epoch)
					}
				}
			}
		}
		if err := sleep(ctx, ls.cfg.Clock, ls.cfg.Backoff.Delay(min(attempt, 8))); err != nil {
			return nil, fmt.Errorf("%w: run %s: an older lease has not lapsed yet: %v", ErrLeaseHeld, run, err)
		}
	}
}

// Holder reads run's lease through the bucket stream's leader (not a replica's possibly
// older copy): its value, and whether it is held (live: not deleted, not lapsed). The
// leader reads it before a reclaim (engine/internal/leader).
func (ls *Leases) Holder(ctx context.Context, run string) (LeaseValue, bool, error) {
	cur, err := readLatest(ctx, ls.kv, run)
	if err != nil || !cur.found || cur.deleted {
		return LeaseValue{}, false, err
	}
	var v LeaseValue
	if err := json.Unmarshal(cur.value, &v); err != nil {
		return LeaseValue{}, false, fmt.Errorf("epoch: lease of %s: %w", run, err)
	}
	return v, true, nil
}

func (ls *Leases) start(ctx context.Context, val LeaseValue, raw []byte, rev uint64, sent time.Time) *Lease {
	ls.cfg.Counters.LeasesAcquired.Add(1)
	what := fmt.Sprintf("lease of run %s at epoch %d (%s)", val.Run, val.Epoch, val.Owner)
	l := &Lease{value: val}
	l.k = newKeeper(context.WithoutCancel(ctx), ls.kv, val.Run, raw, rev, sent, &ls.cfg, what, false,
		func() { ls.cfg.Counters.LeasesLost.Add(1) })
	return l
}
