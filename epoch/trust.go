package epoch

import "time"

// The holder's clock as a pure core: every timing decision of a lease or term holder
// (when to renew, when to give up on one renewal, whether it may still believe it holds,
// when the kill switch and the poison pill fire, whether it is degraded) is a method of
// LeaseClock or Trust that takes the time it is asked at. Nothing here reads a clock,
// starts a goroutine or does I/O. The keeper carries the decisions out against NATS and
// Config.Clock; a test or a deterministic simulation drives the same methods with
// whatever times it likes (testdata/*.txt are the transcripts).

// LeaseClock is the timing policy of the holders of one Config: the TTL, the renew
// interval, and the durations derived from them. Get it from [Config.LeaseClock]; the
// zero LeaseClock is not useful.
type LeaseClock struct {
	ttl, renewInterval time.Duration
}

// TTL is how long the server keeps a key after its last write.
func (p LeaseClock) TTL() time.Duration { return p.ttl }

// RenewInterval is how long after a successful renewal was sent the next one is due.
func (p LeaseClock) RenewInterval() time.Duration { return p.renewInterval }

// TrustWindow is 2/3 of the TTL: how long after it sent its last successful renewal a
// holder believes it still holds. The server started that renewal's TTL later than the
// send, so the holder stops believing at least TTL/3 before the server lets anyone in.
func (p LeaseClock) TrustWindow() time.Duration { return p.ttl * 2 / 3 }

// PoisonAfter is 70% of the TTL: how long after its last successful renewal was sent a
// holder that lost its ownership, with FastFail, exits the process (the poison pill). It
// is after the trust window, so cooperative work has been cancelled by then, and before
// the TTL, so the process is gone before the server lets another owner in.
func (p LeaseClock) PoisonAfter() time.Duration { return p.ttl * 7 / 10 }

// RenewalTimeout bounds one renewal attempt: half the renew interval (TTL/6 by
// default), at least 50ms. A renewal unanswered within it makes the holder degraded and
// is retried at once, which leaves several tries before the trust window ends.
func (p LeaseClock) RenewalTimeout() time.Duration {
	return max(p.renewInterval/2, minRenewalTimeout)
}

// LapseAfter is how long the leader's lease watcher, while its watch is current, goes
// without seeing a lease renewed before it reports the lease lapsed by its own clock:
// a TTL and a renew interval of slack. (The server's own lapse marker usually comes
// first.)
func (p LeaseClock) LapseAfter() time.Duration { return p.ttl + p.renewInterval }

// Begin is the trust of a holder whose create (or adopting renewal) was sent at sent
// and succeeded.
func (p LeaseClock) Begin(sent time.Time) Trust { return Trust{p: p, sent: sent} }

// Trust is a holder's belief in its ownership at one point of its life, as a value:
// the send time of its last successful renewal, whether the ownership ended otherwise
// (a renewal refused), and whether a renewal went unanswered. Methods that change it
// return a new Trust. Times are on whatever clock the caller uses (the keeper:
// Config.Clock, monotonic when real); only differences of two times of the same clock
// are ever taken. The zero Trust is not useful: begin with LeaseClock.Begin.
type Trust struct {
	p        LeaseClock
	sent     time.Time // send time of the last successful renewal (or of the create)
	ended    time.Time // when the ownership ended other than by time (Ended); zero until then
	degraded time.Time // when a renewal first went unanswered; zero since one was answered
}

// LeaseClock is the policy this trust follows.
func (t Trust) LeaseClock() LeaseClock { return t.p }

// Sent is the send time of the last successful renewal (or of the create).
func (t Trust) Sent() time.Time { return t.sent }

// Deadline is when the trust window closes and the kill switch fires: TrustWindow
// after Sent, or when the ownership Ended if that is earlier.
func (t Trust) Deadline() time.Time {
	d := t.sent.Add(t.p.TrustWindow())
	if !t.ended.IsZero() && t.ended.Before(d) {
		return t.ended
	}
	return d
}

// Open reports whether the holder may still believe it holds at now: now is before
// Deadline. Check, before every write, asks this.
func (t Trust) Open(now time.Time) bool { return now.Before(t.Deadline()) }

// RenewAt is when the next renewal is due: RenewInterval after the last successful
// one was sent.
func (t Trust) RenewAt() time.Time { return t.sent.Add(t.p.renewInterval) }

// AttemptDeadline is when a renewal attempt sent at start is given up as unanswered:
// RenewalTimeout after start, but never past Deadline (an answer after it is useless:
// the kill switch has fired).
func (t Trust) AttemptDeadline(start time.Time) time.Time {
	return minTime(start.Add(t.p.RenewalTimeout()), t.Deadline())
}

// RetryAt is when to try again after an attempt sent at start failed without an answer
// at failed. An attempt that ran to its deadline is retried at once; one that failed
// before it (no responders, a closed connection) waits a quarter of the renewal timeout,
// but not past the attempt's deadline, so that a dead connection is not spun on.
func (t Trust) RetryAt(start, failed time.Time) time.Time {
	deadline := t.AttemptDeadline(start)
	if !failed.Before(deadline) {
		return failed
	}
	return minTime(failed.Add(t.p.RenewalTimeout()/4), deadline)
}

// PoisonAt is when a lost holder with FastFail exits the process: PoisonAfter after
// the last successful renewal was sent (unless it released first).
func (t Trust) PoisonAt() time.Time { return t.sent.Add(t.p.PoisonAfter()) }

// Degraded reports that the last renewal attempt went unanswered: the holder should
// take no new work until a renewal succeeds.
func (t Trust) Degraded() bool { return !t.degraded.IsZero() }

// DegradedSince is when the holder became degraded; zero when it is not.
func (t Trust) DegradedSince() time.Time { return t.degraded }

// Renewed is the trust after a renewal sent at sent succeeded: the window now runs
// from sent, and the holder is no longer degraded. Apply it only to an answer that came
// by AttemptDeadline(sent). A renewal sent at or after Deadline (or after the ownership
// Ended) changes nothing: a window that has closed stays closed (the kill switch has fired). An
// older send than Sent's moves nothing back.
func (t Trust) Renewed(sent time.Time) Trust {
	if !t.Open(sent) {
		return t
	}
	if sent.After(t.sent) {
		t.sent = sent
	}
	t.degraded = time.Time{}
	return t
}

// Unanswered is the trust after a renewal attempt failed without an answer at at
// (its deadline passed, or the connection failed): degraded since at, unless it was
// already. The window does not move: only a successful renewal moves it.
func (t Trust) Unanswered(at time.Time) Trust {
	if t.degraded.IsZero() {
		t.degraded = at
	}
	return t
}

// Ended is the trust after the ownership ended at at for a reason other than time: a
// renewal refused (the key holds another owner's value, or is gone), a term's failed
// renewal, a release. The window closes at at, if it had not closed already.
func (t Trust) Ended(at time.Time) Trust {
	if t.ended.IsZero() || at.Before(t.ended) {
		t.ended = at
	}
	return t
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
