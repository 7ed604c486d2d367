package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// Health is what a node can say of its own readiness, taken at one moment (Health).
type Health struct {
	// Connected: the NATS connection is up.
	Connected bool
	// Parts are the supervised long-lived NATS interactions (log-consumer, election,
	// lease-watcher, tasks, api) and whether each heard from NATS within its limit.
	Parts []PartHealth
	// Problems say, one line each, why the node is not ready (empty: it is).
	Problems []string
	// Applied is the log sequence the state has applied; LastSeq the log's last one
	// (0 if it could not be read: a problem says why).
	Applied, LastSeq uint64
	// ApplierErr is why the applier stopped for good (nil while it runs).
	ApplierErr error
}

// PartHealth is one supervised part's health.
type PartHealth struct {
	Name     string
	Healthy  bool
	Problem  string // why not healthy (a part restarting says why it stopped, and how often in a row)
	Restarts int64
	// InARow counts its restarts since it last ran healthy for a while (the backoff's
	// attempt; internal/base/supervise); LastReason is why it last stopped.
	InARow     int
	LastReason string
}

func (e *Engine) partHealth() []PartHealth {
	st := e.sup.Status()
	out := make([]PartHealth, len(st))
	for i, p := range st {
		out[i] = PartHealth{Name: p.Name, Healthy: p.Healthy, Problem: p.Problem, Restarts: p.Restarts,
			InARow: p.InARow, LastReason: p.LastReason}
	}
	return out
}

// ReadyLag is how far behind the log a node may be and still call itself ready.
const ReadyLag = 1000

// Health reports the node's readiness: NATS reachable, every supervised part heard
// from within its silence limit (a node cut off by a silent partition is not ready
// until every part works again), a term it can lead with, the applier running and
// caught up with the log to within ReadyLag.
func (e *Engine) Health(ctx context.Context) Health {
	h := Health{Connected: e.nc != nil && e.nc.IsConnected(), Parts: e.partHealth(), Applied: e.store.Applied()}
	if !h.Connected {
		h.Problems = append(h.Problems, "NATS is not reachable")
	}
	h.Problems = append(h.Problems, e.sup.Problems()...)
	h.Problems = append(h.Problems, e.streamProblems(ctx)...)
	if e.leader != nil {
		if p := e.leader.Problem(); p != "" {
			h.Problems = append(h.Problems, "leadership: "+p)
		}
	}
	if h.ApplierErr = e.clog.Applier.Err(); h.ApplierErr != nil {
		h.Problems = append(h.Problems, "the applier stopped: "+h.ApplierErr.Error())
	}
	last, err := e.clog.Applier.LastSeq(ctx)
	switch {
	case err != nil:
		h.Problems = append(h.Problems, "cannot read the log: "+err.Error())
	case last > h.Applied+ReadyLag:
		h.LastSeq = last
		h.Problems = append(h.Problems, fmt.Sprintf("applier behind: %d of %d", h.Applied, last))
	default:
		h.LastSeq = last
	}
	return h
}

// ApplierFailed is closed when the applier stops for good; Health's ApplierErr then
// says why (a logstream.ErrWrongLog means the node must not serve at all).
func (e *Engine) ApplierFailed() <-chan struct{} { return e.clog.Applier.Failed() }

// Metrics are the node's counters and gauges, taken at one moment (Metrics): what
// flowd's /metrics exports.
type Metrics struct {
	// The applier's counters (the whole log's verdicts as this node applied them).
	CommitsAccepted, CommitsFenced, EpochChanges, StaleTerms, LogRejected, RunsRetired int64
	// HighestTerm is the highest leader term applied (or this node's, if it leads with
	// a higher one); Leading says whether it leads.
	HighestTerm int64
	Leading     bool
	// Lease and election counters of this node.
	RenewalsOK, RenewalsFailed, LeasesLost, LeasesAcquired, TermsWon int64
	LeaseDegraded                                                    time.Duration
	// Runs by status, in this node's state.
	Runs map[checkpoint.RunStatus]int
	// Parked are the waiting runs by what they wait for (checkpoint.Waiting's Kind: signal,
	// approval, timer), of the first MaxParkedCounted waiting runs.
	Parked map[string]int
	// DeadlinesMissed counts, by workflow, the runs this node saw miss their deadline.
	DeadlinesMissed map[string]int64
	// Queued are the runs waiting for an epoch (admission); Assigned those holding one
	// and not yet claimed.
	Queued, Assigned int
	// ApplyLag is how many log messages this node has not applied (-1: unknown).
	ApplyLag int64
	// WaitingForLabel counts the queued runs no live node can take, by the first worker
	// label none has (of the first MaxParkedCounted queued runs; labels.go).
	WaitingForLabel map[string]int
	// Rates are this node's rate limits' counters, by key (the keys its steps paced).
	Rates map[string]RateCounts
	// Workers' counters. TasksNotHere: tasks put back for a worker label this node lacks.
	Stolen, HandedBack, TasksDeferred, TasksNotHere, StepAttempts, StepFailures int64
	// NATSReconnects counts the connection's reconnects; PartRestarts the supervised
	// parts' restarts, and RestartsByPart by part name (every part that ever ran, even if
	// it has ended since: a counter); Parts their health.
	NATSReconnects uint64
	PartRestarts   int64
	RestartsByPart map[string]int64
	Parts          []PartHealth
}

// Metrics reads the node's counters.
func (e *Engine) Metrics(ctx context.Context) Metrics {
	c := e.store.Counters()
	m := Metrics{CommitsAccepted: c.CommitsAccepted.Load(), CommitsFenced: c.CommitsFenced.Load(), EpochChanges: c.EpochChanges.Load(),
		StaleTerms: c.StaleTerms.Load(), LogRejected: c.LogRejected.Load(), RunsRetired: c.Retired.Load(),
		HighestTerm: e.store.HighestTerm(), Runs: map[checkpoint.RunStatus]int{}, Queued: e.store.QueuedRuns(), ApplyLag: -1}
	if t := e.leading(); t != nil {
		m.HighestTerm, m.Leading = max(m.HighestTerm, t.Term()), true
	}
	lc := e.leases.Config().Counters
	m.RenewalsOK, m.RenewalsFailed, m.LeasesLost = lc.RenewalsOK.Load(), lc.RenewalsFailed.Load(), lc.LeasesLost.Load()
	m.LeasesAcquired, m.TermsWon, m.LeaseDegraded = lc.LeasesAcquired.Load(), lc.TermsWon.Load(), lc.Degraded()
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning, checkpoint.StatusSucceeded,
		checkpoint.StatusFailed, checkpoint.StatusCancelled, checkpoint.StatusDeadLettered, checkpoint.StatusWaiting} {
		n, _ := e.store.CountRuns(st)
		m.Runs[st] = n
	}
	m.Assigned, _ = e.store.Held()
	m.Parked = e.parked()
	m.DeadlinesMissed = e.store.DeadlinesMissed()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if last, err := e.clog.Applier.LastSeq(ctx); err == nil {
		m.ApplyLag = int64(last - min(last, e.store.Applied()))
	}
	s := e.workers.Stats()
	m.Stolen, m.HandedBack, m.TasksDeferred, m.TasksNotHere = s.Stolen.Load(), s.HandedBack.Load(), s.TasksDeferred.Load(), s.TasksNotHere.Load()
	m.WaitingForLabel = e.waitingForLabel()
	m.Rates = e.rateCounts()
	m.StepAttempts, m.StepFailures = s.StepAttempts.Load(), s.StepFailures.Load()
	if e.nc != nil {
		m.NATSReconnects = e.nc.Stats().Reconnects
	}
	m.PartRestarts, m.RestartsByPart, m.Parts = e.sup.Restarts(), e.sup.RestartsByPart(), e.partHealth()
	return m
}

// MaxParkedCounted bounds the waiting runs Metrics reads to count them by kind (one
// page of the status index: a scrape costs at most that many runs read).
const MaxParkedCounted = 10000

// parked counts the waiting runs by what they wait for (every kind present, 0 if none).
func (e *Engine) parked() map[string]int {
	out := map[string]int{checkpoint.WaitSignal: 0, checkpoint.WaitApproval: 0, checkpoint.WaitTimer: 0, checkpoint.WaitChild: 0, checkpoint.WaitConcurrency: 0}
	runs, _, err := e.store.ListRuns(checkpoint.ListOptions{Status: checkpoint.StatusWaiting, Limit: MaxParkedCounted})
	if err != nil {
		return out
	}
	for i := range runs {
		if w := runs[i].Waiting; w != nil {
			out[w.Kind]++
		}
	}
	return out
}
