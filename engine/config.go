package engine

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steplog"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// NATSUser is a user of the embedded server (flowd --auth): a name and a password
// (plain or bcrypt), or an nkey's public key, and a role (client.Roles).
type NATSUser struct {
	Name, Password, NKey, Role string
}

// TLSFiles are PEM files: a certificate, its key, and a CA.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Config of an Engine. Zero values take the documented defaults.
type Config struct {
	// NodeID names this node in leases, epochs and logs (default: the host name).
	NodeID string
	// DataDir holds the state (and the embedded NATS store). Default ./flow-data.
	DataDir string
	// NATSURL joins an external NATS (JetStream) server or cluster; empty embeds one.
	NATSURL string
	// NATSListen is the embedded server's client address (default 127.0.0.1:4222);
	// "-" means in process only (tests).
	NATSListen string
	// NATSOptions are added to the connection to an external NATS (credentials, TLS).
	NATSOptions []nats.Option
	// NATSAdminOptions, with NATSURL, make a second connection, an admin's (full
	// JetStream rights in flow's account): this node's admin path over flow's streams,
	// which the node role may not reconfigure (cluster repair; a changed lease TTL set at
	// start). A node that embeds its server has one without it (its in-process
	// connection).
	NATSAdminOptions []nats.Option
	// NATSAuth makes the embedded server refuse every connection but NATSUsers' (each
	// with its role's permissions) and this process's own (docs/security.md).
	NATSAuth  bool
	NATSUsers []NATSUser
	// NATSServerTLS serves TLS on the embedded server's client port (NATSListen) when
	// its certificate and key are given, and verifies clients' certificates against its
	// CA when that is given too (docs/security.md). This node's own connection to its
	// embedded server is in process either way.
	NATSServerTLS TLSFiles
	// Workers is how many runs this node executes at once (default 8).
	Workers int
	// StepParallelism bounds the steps of one run running at once (default 8).
	StepParallelism int
	// MaxRunTree bounds a run's whole tree (the run, its children, theirs...): a child
	// start that would pass it fails its step (default DefaultMaxRunTree; -1: no bound).
	MaxRunTree int
	// ParkAfter is the shortest sleep step that parks its run (no lease, no worker)
	// instead of holding a worker (default: three lease TTLs; docs/waits.md).
	ParkAfter time.Duration
	// Lease configures run leases and the election (TTL default 10s).
	Lease epoch.Config
	// Registry holds the step kinds (default: the built-ins, with ExecEnv and ExecUser).
	Registry *steps.Registry
	// ExecEnv names this process's environment variables that exec steps also get
	// (steps.WithExecEnv), also on a Registry given here.
	ExecEnv []string
	// ExecUser, if set, is the user exec steps run as (flowd --exec-user;
	// steps.WithExecUser), also on a Registry given here: a security setting must not
	// be lost because an embedding program brought its own registry.
	ExecUser *steps.User
	// PriorityAging raises a queued run's priority by one for each PriorityAging it has
	// waited, when this node leads (default DefaultPriorityAging; flowd
	// --priority-aging): a run of priority p waits behind runs of priority q submitted
	// after it for at most (q - p) x PriorityAging.
	PriorityAging time.Duration
	// Labels are this node's worker labels (flowd --labels; workflow.ParseLabels): its
	// workers take only runs whose workflow's labels (workflow.Workflow.Labels) it has
	// all of, and the leader assigns a run only while a live node has them.
	Labels []string
	// MaxOutputBytes bounds one step output (default 1 MiB).
	MaxOutputBytes int
	// StepLogLimit bounds what is kept of one step attempt's printed lines (default
	// steplog.DefaultLimit, 1 MiB); past it a marker says the rest was not kept.
	StepLogLimit int64
	// ReconcileInterval paces the leader's reconcile pass (default 2s).
	ReconcileInterval time.Duration
	// HoldClusterVersion keeps the cluster version where it is while this node is a
	// member (flowd --hold-cluster-version; docs/operations.md, "Upgrading").
	HoldClusterVersion bool
	// ReadFormat, if set, makes this node read, and say it reads, log formats up to it
	// only, as the release that read that much (tests of mixed clusters: the
	// simulation's node of an older release; 0: this binary's, checkpoint.MaxReadFormat).
	ReadFormat int
	// DisableScheduler keeps this node out of leader elections: it only runs steps
	// (a worker-only node; tests that write scheduler entries themselves).
	DisableScheduler bool
	// LockDelay, if set, makes the leader wait this long after a lease lapsed before it
	// reclaims the run (for downstream systems that cannot check the epoch).
	LockDelay time.Duration
	// CronGrace is how late a cron tick may be and still fire as on time; later ticks
	// were missed (no leader ran) and follow the schedule's catch-up policy (default 30s).
	CronGrace time.Duration
	// Logger receives the engine's logs (default: discard).
	Logger *slog.Logger
	// Now is the wall clock that manual runs' {{ now }}, {{ today }} and {{ yesterday }}
	// defaults are rendered at (default time.Now). Tests pin it: a default that depends
	// on today's date must not make a test depend on it.
	Now func() time.Time
	// Clock is the time of the node's decisions: the leader's reconcile, lock delay,
	// cron and retention, the workers' timings, the leases (Lease.Clock) (default: the
	// real clock). Tests hold it still or move it (clockwork.NewFakeClock).
	Clock clockwork.Clock
	// StepObserver, if set, is told of every finished step attempt (for metrics).
	StepObserver func(kind string, d time.Duration, err error)
	// SnapshotEvery is how many log messages the leader lets pass between snapshots of
	// the state (default 100,000); after each it compacts the log (docs/checkpoint.md,
	// "Snapshots and compaction").
	SnapshotEvery uint64
	// Retention is how long a run that ended (succeeded, failed, cancelled) is kept
	// before the leader retires it from every node's state (default 720h). Dead-lettered
	// runs stay until purged.
	Retention time.Duration

	// unsynced: the embedded server does not fsync (benchmarks of what is not the disk).
	unsynced bool
}

// DefaultRetention is Config.Retention's default: 30 days.
const DefaultRetention = 720 * time.Hour

// DefaultSnapshotEvery is Config.SnapshotEvery's default.
const DefaultSnapshotEvery = 100_000

// WithDefaults returns a copy of c with every zero field filled with its documented
// default (the host name as NodeID, ./flow-data, 8 workers, the built-in step kinds,
// ...). New applies it; Validate checks its result.
func (c Config) WithDefaults() Config {
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || !ident.ValidID(h) {
			h = "node"
		}
		c.NodeID = h
	}
	if c.DataDir == "" {
		c.DataDir = "flow-data"
	}
	if c.NATSListen == "" {
		c.NATSListen = "127.0.0.1:4222"
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	switch c.MaxRunTree {
	case 0:
		c.MaxRunTree = DefaultMaxRunTree
	case -1:
		c.MaxRunTree = 0 // the log's "no bound"
	}
	if c.StepParallelism == 0 {
		c.StepParallelism = 8
	}
	if c.PriorityAging == 0 {
		c.PriorityAging = DefaultPriorityAging
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = logstream.DefaultMaxOutputBytes
	}
	if c.CronGrace <= 0 {
		c.CronGrace = 30 * time.Second
	}
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = DefaultSnapshotEvery
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = 2 * time.Second
	}
	if c.Registry == nil && c.MaxOutputBytes > 0 {
		c.Registry = steps.NewRegistry(c.MaxOutputBytes, c.execOptions()...)
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Now == nil {
		c.Now = c.Clock.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Lease.Logger == nil {
		c.Lease.Logger = c.Logger
	}
	if c.Lease.Clock == nil {
		c.Lease.Clock = c.Clock
	}
	if c.Lease.BeforeExit == nil {
		// The poison pill kills every exec step's processes before the process exits
		// (their inits would see it die and kill them, but only after the exit; a step
		// without containment would leave what it started).
		c.Lease.BeforeExit = func() { steps.KillProcessGroups() }
	}
	// Defaults once, here: the elector and the leases then share its Counters, and the
	// engine reads TTL and Backoff from it.
	c.Lease = c.Lease.WithDefaults()
	return c
}

// execOptions configure exec steps: ExecEnv, ExecUser.
func (c Config) execOptions() []steps.RegistryOption {
	return []steps.RegistryOption{steps.WithExecEnv(c.ExecEnv...), steps.WithExecUser(c.ExecUser)}
}

// Validate checks c with its defaults applied (WithDefaults) and changes nothing. The
// error names the field and the fix.
func (c Config) Validate() error {
	d := c.WithDefaults()
	if !ident.ValidID(d.NodeID) {
		return fmt.Errorf("engine: Config.NodeID %q: %s", d.NodeID, ident.IDRule)
	}
	if c.MaxRunTree < -1 {
		return fmt.Errorf("engine: Config.MaxRunTree %d: use a positive bound, or -1 for none", c.MaxRunTree)
	}
	if c.StepLogLimit < 0 {
		return fmt.Errorf("engine: Config.StepLogLimit must not be negative (0 takes the default, %d bytes)", steplog.DefaultLimit)
	}
	if c.Workers < 0 || c.StepParallelism < 0 || c.MaxOutputBytes < 0 {
		return fmt.Errorf("engine: Config.Workers, StepParallelism and MaxOutputBytes must not be negative (0 takes the default)")
	}
	if c.PriorityAging < 0 {
		return fmt.Errorf("engine: Config.PriorityAging %s: give a positive duration (0 takes the default, %s)", c.PriorityAging, DefaultPriorityAging)
	}
	if len(c.Labels) > workflow.MaxLabels {
		return fmt.Errorf("engine: Config.Labels: %d labels; at most %d", len(c.Labels), workflow.MaxLabels)
	}
	for _, l := range c.Labels {
		if !workflow.ValidLabel(l) {
			return fmt.Errorf("engine: Config.Labels: %q is not a label: use 1-63 of a-z, 0-9, '-' and '_', starting with a letter or digit", l)
		}
	}
	if d.Registry.Has(worker.DrillStepKind) {
		return fmt.Errorf("engine: Config.Registry: step kind %s is reserved for flowctl drill zombie; rename yours", worker.DrillStepKind)
	}
	return d.Lease.Validate()
}

// DefaultPriorityAging is Config.PriorityAging's default: a backfill at -10 waits behind
// tonight's payout at 10 for at most 200 minutes of its own waiting.
const DefaultPriorityAging = 10 * time.Minute

// DefaultMaxRunTree is the most runs one run's tree holds (the run and every descendant)
// unless --max-run-tree says otherwise: Temporal's bound on a workflow's pending children
// is 2,000 too. One foreach over 10,001 child workflows once made 3,100 runs before it
// was cancelled.
const DefaultMaxRunTree = 2000

// readFormats are the log formats this node reads, and says it reads: this binary's, or
// up to ReadFormat.
func (c Config) readFormats() []int {
	f := checkpoint.ReadFormats()
	if c.ReadFormat > 0 && c.ReadFormat < len(f) {
		f = f[:c.ReadFormat]
	}
	return f
}
