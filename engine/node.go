package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/logstream"
)

// The node's I/O: NATS (embedded or external), the streams and buckets, the state, and
// what the services are given to reach them. Nothing here decides anything.

// NodesBucket holds each live node's applied sequence (engine/internal/nodes).
const NodesBucket = nodes.Bucket

// open connects (or embeds) NATS and opens flow's streams and buckets as ports (or takes
// the ports it was built over: NewOver), opens the state (from the newest snapshot when
// it has none), and wires the log, the elector, the leases, the task queue and the gate
// over the ports.
func (e *Engine) open(ctx context.Context) (err error) {
	if e.over != nil {
		e.ports = e.over.Ports
		if e.store, err = checkpoint.OpenStore(e.over.StateDir, checkpoint.StoreOptions{FS: e.over.FS, Hooks: e.hooks, OnStatus: e.statusChanged, ReadFormat: e.cfg.ReadFormat}); err != nil {
			return err
		}
		return e.wire()
	}
	if err := e.openNATS(ctx); err != nil {
		return err
	}
	// A node with no state, or one behind the log's first sequence, starts from the
	// newest snapshot (the log after it is applied as usual).
	if err := retrySetup(ctx, e.log, func(ctx context.Context) error {
		return logstream.PrepareState(ctx, e.ports.Log, e.ports.Snapshots, filepath.Join(e.cfg.DataDir, "state"), e.log)
	}); err != nil {
		return err
	}
	if e.store, err = checkpoint.OpenStore(filepath.Join(e.cfg.DataDir, "state"), checkpoint.StoreOptions{Hooks: e.hooks, OnStatus: e.statusChanged, ReadFormat: e.cfg.ReadFormat}); err != nil {
		return err
	}
	if err := e.wire(); err != nil {
		return err
	}
	// A stream sealed or reconfigured by a stranger is said now, with what to do (streams.go).
	e.checkStreams(ctx)
	return nil
}

// openNATS connects (or embeds) NATS and opens flow's streams and buckets (jsport.Open).
func (e *Engine) openNATS(ctx context.Context) (err error) {
	if e.cfg.NATSURL == "" {
		listen := e.cfg.NATSListen
		if listen == "-" {
			listen = ""
		}
		e.srv, err = natsnode.Start(natsnode.Config{DataDir: filepath.Join(e.cfg.DataDir, "nats"), Listen: listen,
			ServerName: e.cfg.NodeID, Logger: e.log, NoSync: e.cfg.unsynced, Auth: e.cfg.NATSAuth, Users: natsUsers(e.cfg.NATSUsers),
			TLS: natsnode.TLSFiles(e.cfg.NATSServerTLS)})
		if err != nil {
			return err
		}
		e.nc, err = e.srv.Connect(append(e.connOptions(), nats.Name(e.cfg.NodeID))...)
	} else {
		e.nc, err = natsnode.Connect(e.cfg.NATSURL, e.cfg.NodeID, append(e.connOptions(), e.cfg.NATSOptions...)...)
	}
	if err != nil {
		return err
	}
	if e.js, err = jetstream.New(e.nc); err != nil {
		return fmt.Errorf("engine: jetstream: %w", err)
	}
	if err := e.openAdminPath(); err != nil {
		return err
	}
	e.replicas = jsport.Replicas(e.nc)
	if e.srv == nil {
		e.warnIfUnsynced()
	}
	// Streams and buckets are created by whichever node comes first; on a cluster two
	// nodes creating one replicated stream at once can time out, and a node's first
	// JetStream request meets a cluster that may still be electing (a CI run saw one go
	// unanswered for 5 s and the node give up): retry for a while.
	return retrySetup(ctx, e.log, func(ctx context.Context) (err error) {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		e.ports, err = jsport.Open(sctx, e.js, jsport.Options{Replicas: e.replicas, TTL: e.cfg.Lease.TTL, Admin: e.adminJS, Logger: e.log})
		return err
	})
}

// warnIfUnsynced says at start what flow cannot promise on an external NATS server that
// does not fsync every write. It warns rather than refuses: a stock nats-server syncs
// every 2 minutes, and a user trying flow on one should get a running node and the facts.
func (e *Engine) warnIfUnsynced() {
	switch jsport.ServerSyncPolicy(e.nc, 2*time.Second) {
	case jsport.SyncPeriodic:
		e.log.Warn("the NATS server does not fsync every write: a commit it acknowledged can be lost on a power cut; " +
			"set sync_interval: always in its jetstream block (docs/operations.md, \"Durability\")")
	case jsport.SyncUnknown:
		e.log.Warn("cannot tell whether the NATS server fsyncs every write (its monitoring answers the system account only); " +
			"unless its jetstream block sets sync_interval: always, a commit it acknowledged can be lost on a power cut (docs/operations.md, \"Durability\")")
	}
}

func (e *Engine) natsURL() string {
	if e.srv != nil {
		if u := e.srv.ClientURL(); u != "" {
			return u
		}
		return "in-process"
	}
	return e.cfg.NATSURL
}

// ClientURL is the NATS URL that clients (flowctl) reach this node's NATS at.
func (e *Engine) ClientURL() string { return e.natsURL() }

// wire builds the node's log, elector, leases, task queue and gate over its ports.
func (e *Engine) wire() (err error) {
	logCfg := logstream.DefaultConfig()
	logCfg.Stream, logCfg.Snapshots, logCfg.Store, logCfg.Node = e.ports.Log, e.ports.Snapshots, e.store, e.cfg.NodeID
	logCfg.MaxOutputBytes, logCfg.Logger, logCfg.Supervisor, logCfg.Hooks = e.cfg.MaxOutputBytes, e.log, e.sup, e.hooks
	if e.over != nil {
		logCfg.Nonce, logCfg.Order = e.over.Nonce, e.over.Order
	}
	if e.clog, err = logstream.Open(logCfg); err != nil {
		return err
	}
	e.cfg.MaxOutputBytes = e.clog.Writer.MaxOutputBytes() // fitted to the server's max_payload
	if e.elector, err = epoch.NewElector(e.ports.Leader, e.ports.Terms, e.cfg.NodeID, e.cfg.Lease); err != nil {
		return err
	}
	leaseCfg := e.cfg.Lease
	leaseCfg.Hooks = e.hooks // the lease guards' negative controls are for run leases
	if e.leases, err = epoch.NewLeases(e.ports.Leases, leaseCfg); err != nil {
		return err
	}
	e.tasks = tasks.New(e.ports.Tasks)
	e.gate = gate.New(e.ports.Cluster)
	return nil
}

// retrySetup retries fn on timeouts for up to a minute, with backoff.
func retrySetup(ctx context.Context, log *slog.Logger, fn func(context.Context) error) error {
	policy := backoff.Policy{Base: 200 * time.Millisecond, Cap: 3 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || !isTimeout(err) {
			return err
		}
		log.Warn("JetStream set-up timed out; retrying", "err", err, "attempt", attempt)
		if serr := policy.Sleep(ctx, attempt); serr != nil {
			return err
		}
	}
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

func (e *Engine) closeAll() {
	if e.clog != nil {
		e.clog.Stop()
	}
	if e.store != nil {
		e.store.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.adminNC != nil {
		e.adminNC.Close()
	}
	if e.srv != nil {
		e.srv.Shutdown()
	}
	select {
	case <-e.stopped:
	default:
		close(e.stopped)
	}
}

// connOptions make a silent connection noticed within a lease TTL: a ping every
// quarter TTL, and the connection is declared stale (and replaced) after two go
// unanswered. nats.go's defaults (2 minutes, 2 pings) would leave a node cut off by a
// silent partition believing itself connected for four minutes. Reconnects are logged
// and counted (flow_nats_reconnects_total).
func (e *Engine) connOptions() []nats.Option {
	ping := max(e.cfg.Lease.TTL/4, 100*time.Millisecond)
	return []nats.Option{
		nats.PingInterval(ping), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			e.log.Warn("NATS connection lost; reconnecting", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			e.log.Info("NATS connection recovered", "server", nc.ConnectedUrlRedacted())
		}),
	}
}

func natsUsers(users []NATSUser) []natsnode.User {
	out := make([]natsnode.User, len(users))
	for i, u := range users {
		out[i] = natsnode.User{Name: u.Name, Password: u.Password, NKey: u.NKey, Role: u.Role}
	}
	return out
}

// compactor is the leader's access to the log's first sequence, the purge, and the
// other nodes' reports (leader.Compactor).
type compactor struct{ e *Engine }

func (c compactor) LiveApplied(ctx context.Context) (uint64, bool, error) {
	low, any, err := nodes.LiveApplied(ctx, c.e.ports.Nodes, c.e.cfg.NodeID)
	if err != nil {
		return 0, false, fmt.Errorf("engine: compact: read the nodes' reports: %w", err)
	}
	return low, any, nil
}

func (c compactor) FirstSeq(ctx context.Context) (uint64, error) {
	info, err := c.e.ports.Log.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("engine: compact: %w", err)
	}
	return info.FirstSeq, nil
}

func (c compactor) Purge(ctx context.Context, keep uint64) error {
	if killDuringPurge != "" {
		c.e.killDuringPurge(keep)
	}
	if err := c.e.ports.Log.Purge(ctx, keep); err != nil {
		return fmt.Errorf("engine: compact the log below %d: %w", keep, err)
	}
	return nil
}

// killDuringPurge, set at link time (-ldflags "-X .../engine.killDuringPurge=1") and empty
// in every other build, makes the leader SIGKILL its own process while its first purge
// of the log is under way (with the embedded server, the server dies mid-purge too): the
// real-process test that a node still starts after a crash during a purge (clustertest
// TestCrashDuringSnapshotRestoreAndPurge).
var killDuringPurge string

func (e *Engine) killDuringPurge(keep uint64) {
	e.log.Warn("test build: this process kills itself during the purge (killDuringPurge)", "below", keep)
	go func() { _ = e.ports.Log.Purge(context.Background(), keep) }()
	// A jitter of up to a millisecond, so that repeated runs land at different points of
	// the purge: fault injection, not synchronisation.
	time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
