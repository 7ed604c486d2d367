package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
)

// Flow's streams and buckets as this node wants them, and what it does when one
// differs: a node's credential can create them but not update, seal or delete them
// (client/roles.go), so a stream someone sealed or reconfigured is reported, at start,
// in the log and in readyz, with the command that mends it (cluster repair), and only
// an admin path mends it: flowd's own in-process connection to the server it embeds,
// or on an external NATS an admin's credential the operator gives (NATSAdminOptions).

// ErrNoAdminPath: this node reaches NATS with a node's credential, which cannot
// reconfigure or recreate flow's streams.
var ErrNoAdminPath = errors.New("this node joined NATS over the network with a node's credential, which may not reconfigure or recreate flow's streams: " +
	"run the repair on a flowd that embeds its NATS server, or, on an external NATS, with an admin's credential as docs/security.md (\"Sealing and repair\") says")

// openAdminPath sets adminJS: the embedded server's in-process connection, or an
// admin's connection to the external NATS when NATSAdminOptions are given.
func (e *Engine) openAdminPath() error {
	if e.srv != nil {
		e.adminJS = e.js
		return nil
	}
	if len(e.cfg.NATSAdminOptions) == 0 {
		return nil
	}
	nc, err := natsnode.Connect(e.cfg.NATSURL, e.cfg.NodeID+"-admin", e.cfg.NATSAdminOptions...)
	if err != nil {
		return fmt.Errorf("engine: the admin's connection (NATSAdminOptions): %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("engine: the admin's connection: %w", err)
	}
	e.adminNC, e.adminJS = nc, js
	e.log.Warn("this node holds an admin's JetStream credential: it can repair and reconfigure flow's streams; start it without once they are mended (docs/security.md, \"Sealing and repair\")")
	return nil
}

// streamCheckEvery is how long a check of the streams serves readyz before the next.
const streamCheckEvery = 2 * time.Second

// streamCheck is the newest check of flow's streams.
type streamCheck struct {
	mu       sync.Mutex
	ready    bool // the streams are open (checkStreams): before, there is nothing to check
	at       time.Time
	findings []jsport.Finding
	err      error
}

// wantedStreams are flow's streams and buckets as this node creates them.
func (e *Engine) wantedStreams() []jsport.Want {
	ttl := e.leases.Config().TTL
	logW := jsport.WantStream(jsport.LogConfig(e.replicas))
	logW.Refuse = "the log is the state of every run: deleting it loses them (docs/security.md, \"Sealing and repair\")"
	dlqW := jsport.WantStream(jsport.DLQConfig(e.replicas))
	dlqW.Refuse = "the DLQ stream holds the dead-letter notices alerting reads (docs/security.md, \"Sealing and repair\")"
	snapW := jsport.WantObjectStore(jsport.SnapshotsConfig(e.replicas))
	snapW.Refuse = "the snapshots are what a new node starts from once the log is compacted (docs/security.md, \"Sealing and repair\")"
	leaderW := jsport.WantKV(jsport.LeaderConfig(ttl, e.replicas))
	leaderW.Recreate, leaderW.KeepSequence = true, true
	leasesW := jsport.WantKV(jsport.LeasesConfig(ttl, e.replicas))
	leasesW.Recreate = true // leases lost: their runs get new epochs, and commits are fenced
	nodesW := jsport.WantKV(jsport.NodesConfig(e.replicas))
	nodesW.Recreate = true // every node reports again within nodes.ReportEvery
	gateW := jsport.WantKV(jsport.ClusterConfig(e.replicas))
	gateW.Recreate = true // every node registers again at its next start; the version is in the log
	tasksW := jsport.WantStream(jsport.TasksConfig(e.replicas, e.tasksCap))
	tasksW.Recreate = true // the reconciler queues again every run assigned and not claimed
	stepLogsW := jsport.WantStream(jsport.StepLogsConfig(e.replicas))
	stepLogsW.Recreate = true // what steps printed is lost; nothing decides by it
	ratesW := jsport.WantKV(jsport.RatesConfig(e.replicas))
	ratesW.Recreate = true // rate limits pace again from now: the starts already reserved may go beside the first new ones
	return []jsport.Want{logW, tasksW, dlqW, leaderW, leasesW, nodesW, gateW, snapW, stepLogsW, ratesW}
}

// checkStreams looks at flow's streams once they are open. With an admin path (the
// embedded server) it sets back what only differs in its settings (a changed
// --lease-ttl, the tasks stream's cap), as a start always did; whatever is left is
// logged with what to do, and readyz says it until it is mended.
func (e *Engine) checkStreams(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.tasksCap = jsport.TasksCap(ctx, e.js)
	e.streamCheck.mu.Lock()
	e.streamCheck.ready = true
	e.streamCheck.mu.Unlock()
	wants := e.wantedStreams()
	if e.adminJS != nil {
		var soft []jsport.Want
		found, err := jsport.Check(ctx, e.adminJS, wants)
		for _, f := range found {
			if f.Action == "update" {
				for _, w := range wants {
					if w.Name == f.Stream {
						soft = append(soft, w)
					}
				}
			}
		}
		if err == nil && len(soft) > 0 {
			fixed, err := jsport.Repair(ctx, e.adminJS, soft, false, uint64(max(e.store.HighestTerm(), 0)))
			for _, f := range fixed {
				e.log.Warn("set a stream back to flow's settings", "stream", f.Stream, "was", strings.Join(f.Problems, ", "))
			}
			if err != nil {
				e.log.Error("could not set a stream back to flow's settings", "err", err)
			}
		}
	}
	for _, f := range e.streamFindings(ctx, true) {
		e.log.Error("a stream of flow's differs from what flow needs", "stream", f.Stream, "problem", strings.Join(f.Problems, ", "), "fix", f.String())
	}
}

// streamFindings are the newest check's findings, checked again when it is older than
// streamCheckEvery (or now).
func (e *Engine) streamFindings(ctx context.Context, now bool) []jsport.Finding {
	c := &e.streamCheck
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready || !e.nc.IsConnected() {
		return c.findings // readyz says NATS is unreachable; the check would only wait
	}
	if now || time.Since(c.at) >= streamCheckEvery {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c.findings, c.err = jsport.Check(cctx, e.js, e.wantedStreams())
		cancel()
		c.at = time.Now()
	}
	return c.findings
}

// streamProblems are readyz's lines for the streams that differ.
func (e *Engine) streamProblems(ctx context.Context) []string {
	var out []string
	for _, f := range e.streamFindings(ctx, false) {
		line := "stream " + f.String()
		if e.adminJS == nil && f.Action == "recreate" {
			// Where no flowd embeds the server, cluster repair finds no one to do it.
			line += "; on an external NATS, with an admin's credential: `nats stream rm " + f.Stream + " -f`, then restart flowd (docs/security.md, \"Sealing and repair\")"
		}
		out = append(out, line)
	}
	return out
}

// RepairStreams mends flow's streams and buckets that differ from what flow wants
// (jsport.Repair) through this node's admin path, or, with dryRun, says what it would
// do. Without an admin path it is ErrNoAdminPath. Every handle the node holds is by
// name: a bucket or stream made anew is used from the next call on (the task fetcher
// makes its consumer again when it finds it gone).
func (o Ops) RepairStreams(ctx context.Context, dryRun bool) ([]jsport.Finding, error) {
	e := o.e
	if e.adminJS == nil {
		return nil, ErrNoAdminPath
	}
	found, err := jsport.Repair(ctx, e.adminJS, e.wantedStreams(), dryRun, uint64(max(e.store.HighestTerm(), 0)))
	if f, ok := e.lowTerms(ctx, dryRun); ok {
		found = append(found, f)
	}
	for _, f := range found {
		if f.Done {
			e.log.Warn("repaired a stream of flow's", "stream", f.Stream, "action", f.Action, "was", strings.Join(f.Problems, ", "))
		}
		if f.Done && f.Action == "recreate" && f.Stream == "KV_"+gate.Bucket {
			// This node is a member again at once; the leader adds the other live nodes
			// from their reports (gate.Infer), and each registers itself (its hold
			// included) at its next start.
			if rerr := e.register(ctx); rerr != nil {
				e.log.Error("could not register in the recreated cluster roster", "err", rerr)
			}
		}
	}
	e.streamFindings(ctx, true)
	if err != nil {
		return found, fmt.Errorf("engine: repair: %w", err)
	}
	return found, nil
}

// RepairStreams is cluster.repair: the findings in the wire's terms.
func (a *API) RepairStreams(ctx context.Context, dryRun bool) (client.Repair, error) {
	found, err := a.e.Ops().RepairStreams(ctx, dryRun)
	if errors.Is(err, ErrNoAdminPath) {
		return client.Repair{}, &client.Error{Code: client.CodeConflict, Message: err.Error()}
	}
	out := client.Repair{Node: a.e.cfg.NodeID, DryRun: dryRun, Streams: []client.StreamRepair{}}
	for _, f := range found {
		out.Streams = append(out.Streams, client.StreamRepair{Stream: f.Stream, Problems: f.Problems, Sealed: f.Sealed,
			Action: f.Action, Done: f.Done, Note: f.Note, Error: f.Error})
	}
	return out, err
}

// CanRepair says whether this node has an admin path over flow's streams (it embeds
// its NATS server, or holds an admin's credential): only such a node serves
// cluster.repair.
func (a *API) CanRepair() bool { return a.e.adminJS != nil }

// withStreamFindings is err with what the check found of flow's streams, if anything:
// a start that failed on a sealed bucket says which and what to do.
func (e *Engine) withStreamFindings(ctx context.Context, err error) error {
	var lines []string
	for _, f := range e.streamFindings(ctx, true) {
		lines = append(lines, f.String())
	}
	if len(lines) == 0 {
		return err
	}
	return fmt.Errorf("%w; flow's streams differ from what flow needs: %s", err, strings.Join(lines, "; "))
}

// raisingElector is the leader's elector, whose term raise (a purge of the leader
// bucket's stream) goes through this node's admin path: the node role may purge only
// the log. A node without one tries its own connection (which has the right
// on a server without permissions) and, refused, says what to do.
type raisingElector struct {
	*epoch.Elector
	e *Engine
}

func (r raisingElector) RaiseTerms(ctx context.Context, above int64) error {
	err := r.Elector.RaiseTerms(ctx, above)
	if err != nil && r.e.adminJS == nil && r.e.over == nil {
		return fmt.Errorf("%w (a node credential may not purge the leader bucket: run `flowctl cluster repair` as an admin, which raises the terms through a node with an admin path)", err)
	}
	return err
}

// lowTerms is the repair of a leader bucket whose revisions (the terms it gives) are not
// above the highest term the log applied (a forged entry's, or a bucket made anew
// outside flow): every term won there is stale. It raises them through the admin path,
// which a leader on a node credential cannot (raisingElector).
func (e *Engine) lowTerms(ctx context.Context, dryRun bool) (jsport.Finding, bool) {
	high := e.store.HighestTerm()
	s, err := e.adminJS.Stream(ctx, "KV_"+epoch.LeaderBucket)
	if err != nil || high <= 0 {
		return jsport.Finding{}, false
	}
	last := s.CachedInfo().State.LastSeq
	if last+1 >= uint64(high) { // the next term won (a revision above last) is not below the log's
		return jsport.Finding{}, false
	}
	f := jsport.Finding{Stream: "KV_" + epoch.LeaderBucket, Action: "update",
		Problems: []string{fmt.Sprintf("its revisions (%d) are not above the log's highest term %d: every term won there is stale", last, high)},
		Note:     fmt.Sprintf("its next revision, the next term, moved above %d", high)}
	if dryRun {
		return f, true
	}
	if err := e.elector.RaiseTerms(ctx, high); err != nil { // through the admin path: jsport.Open gave it
		f.Error = err.Error()
		return f, true
	}
	f.Done = true
	e.log.Warn("raised the leader bucket's terms", "above", high)
	return f, true
}
