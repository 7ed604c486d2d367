// Package nodes is what each live node says of itself where the others can read it:
// its applied log sequence, in the FLOW_NODES bucket, renewed every few seconds and
// lapsing a minute after the node stops. A node that stops cleanly says goodbye (its
// last report, Stopped set): it is not live from then on, so it can be forgotten at once
// (cluster forget), while its report still keeps what it needs from compaction until it
// lapses, as for a restart. The leader's compaction keeps every message a live node
// still needs; a node that was away longer restores a snapshot when it comes back.
package nodes

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/port"
)

// Bucket holds each live node's report (port.NodesBucket: on JetStream,
// the nodes bucket (jsport.NodesConfig), whose keys lapse after ReportTTL).
const Bucket = port.NodesBucket

const (
	// ReportEvery is how often a node reports.
	ReportEvery = 5 * time.Second
	// ReportTTL is how long a report lives: a node silent that long is not live.
	ReportTTL = port.NodesReportTTL
)

// Report is what a node says of itself. Binary and Formats (the log formats it reads)
// came with the cluster version: a report without them is from a release before it
// (engine/internal/gate counts such a node as reading format 1 only).
type Report struct {
	Applied uint64    `json:"applied"`
	At      time.Time `json:"at"`
	Binary  string    `json:"binary,omitempty"`
	Formats []int     `json:"formats,omitempty"`
	// Stopped is when the node stopped cleanly (its goodbye; zero while it runs). Older
	// readers ignore it, and count the node live until the report lapses, as before.
	Stopped time.Time `json:"stopped,omitzero"`
	// Labels are the node's worker labels (flowd --labels): the leader assigns a run
	// whose workflow needs labels only while a live node reports them all.
	Labels []string `json:"labels,omitempty"`
	// RateWaits are the steps waiting on the node for a rate limit's moment as it
	// reported (at most MaxRateWaits): how any node shows a run waiting of kind rate.
	RateWaits []RateWait `json:"rate_waits,omitempty"`
}

// RateWait is one step waiting for a rate limit's moment.
type RateWait struct {
	Run   string    `json:"run"`
	Step  string    `json:"step"`
	Item  int       `json:"item"`
	Key   string    `json:"key"`
	Since time.Time `json:"since"`
}

// MaxRateWaits bounds the rate waits a report carries (the oldest are kept).
const MaxRateWaits = 64

// Reporter puts this node's report in the bucket now and every ReportEvery.
type Reporter struct {
	kv      port.KV
	node    string
	about   Report // Binary and Formats
	applied func() uint64
	waits   func() []RateWait // nil: none
	clock   clockwork.Clock
	log     *slog.Logger

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewReporter reports node's applied sequence (applied) into kv, with about's Binary,
// Formats and Labels.
func NewReporter(kv port.KV, node string, about Report, applied func() uint64, clock clockwork.Clock, log *slog.Logger) *Reporter {
	return &Reporter{kv: kv, node: node, about: about, applied: applied, clock: clock, log: log}
}

// WithRateWaits makes every report carry waits() (the first MaxRateWaits). Call it
// before Start.
func (r *Reporter) WithRateWaits(waits func() []RateWait) *Reporter {
	r.waits = waits
	return r
}

// Report puts the report once.
func (r *Reporter) Report(ctx context.Context) { r.put(ctx, false) }

// put puts the report, a goodbye when stopped.
func (r *Reporter) put(ctx context.Context, stopped bool) {
	now := r.clock.Now().UTC()
	rep := Report{Applied: r.applied(), At: now, Binary: r.about.Binary, Formats: r.about.Formats, Labels: r.about.Labels}
	if stopped {
		rep.Stopped = now
	} else if r.waits != nil {
		w := r.waits()
		rep.RateWaits = w[:min(len(w), MaxRateWaits)]
	}
	b, _ := json.Marshal(rep)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := r.kv.Put(pctx, r.node, b); err != nil {
		r.log.Debug("report the applied sequence", "err", err, "goodbye", stopped)
	}
}

// Start reports now and then every ReportEvery until Stop. Safe to call once.
func (r *Reporter) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return
	}
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		tick := r.clock.NewTicker(ReportEvery)
		defer tick.Stop()
		for {
			r.Report(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.Chan():
			}
		}
	}()
}

// Stop stops the reports, waits, and says goodbye: a last report with Stopped set (a
// clean stop; a node killed says none, and is live until its report lapses). Safe twice
// and before Start.
func (r *Reporter) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	r.put(context.Background(), true)
}

// LiveApplied is the lowest applied sequence a node other than self reported, and
// whether any did: a node that said goodbye counts until its report lapses, so that a
// node restarted within a minute finds the log it needs.
func LiveApplied(ctx context.Context, kv port.KV, self string) (uint64, bool, error) {
	live, err := reports(ctx, kv)
	if err != nil {
		return 0, false, err
	}
	low, any := uint64(0), false
	for id, r := range live {
		if id == self {
			continue // a node's own applied sequence is read directly
		}
		if !any || r.Applied < low {
			low, any = r.Applied, true
		}
	}
	return low, any, nil
}

// Live are the live nodes' reports, by node ID: those that have not lapsed, but for a
// node's goodbye (a clean stop).
func Live(ctx context.Context, kv port.KV) (map[string]Report, error) {
	all, err := reports(ctx, kv)
	if err != nil {
		return nil, err
	}
	for id, r := range all {
		if !r.Stopped.IsZero() {
			delete(all, id)
		}
	}
	return all, nil
}

// reports are the reports that have not lapsed, goodbyes included, by node ID.
func reports(ctx context.Context, kv port.KV) (map[string]Report, error) {
	keys, err := kv.Keys(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]Report{}
	for _, k := range keys {
		entry, err := kv.Get(ctx, k)
		if err != nil {
			continue // expired meanwhile
		}
		var r Report
		if json.Unmarshal(entry.Value, &r) != nil {
			continue
		}
		out[k] = r
	}
	return out, nil
}
