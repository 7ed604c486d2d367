package logstream

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Defaults of Config (DefaultConfig).
const (
	DefaultStream          = port.LogStream
	DefaultMaxOutputBytes  = 1 << 20 // 1 MiB per step output
	DefaultMaxBatchEntries = 256
	DefaultPublishTimeout  = 10 * time.Second
	DefaultStallTimeout    = 10 * time.Second
	DefaultNoteDelay       = 5 * time.Millisecond
	envelopeHeadroom       = 4 << 10
	// minOutputBytes is the smallest output limit worth running with: below it a
	// server's max_payload is refused at start rather than fitted.
	minOutputBytes = 4 << 10
)

// Config configures a node's log (Open). Start from DefaultConfig and set Stream, Store
// and Node: Validate refuses a zero limit or timeout instead of filling one in, so that
// the value a caller passes is the value the log runs with.
type Config struct {
	// Stream is the log (port.LogStream: on JetStream, jsport.OpenStream of
	// jsport.LogConfig). Required.
	Stream port.Stream
	// Snapshots is where snapshots are kept (port.SnapshotBucket); nil: none are taken
	// or listed.
	Snapshots port.Objects
	Store     *checkpoint.Store // required: this node's state, fed by the applier
	Node      string            // required: this node's ID (message IDs, envelope)
	// Nonce distinguishes this node's message IDs from those of its earlier lives
	// (default: random). The simulation sets it from its seed.
	Nonce string
	// Order, if set, is called by Write with the entries before it takes them, and
	// returns when they may go: the simulation (engine/internal/sim) lets concurrent
	// writers of one moment in one at a time, in an order of its own, so that what they
	// write together lands in the same order in every replay of a seed. Nil in
	// production.
	Order func(entries []checkpoint.Entry)

	// MaxOutputBytes bounds one step output (default 1 MiB). Above it, Write refuses
	// the entry with ErrOutputTooLarge. Open lowers it (and warns) when the server's
	// max_payload cannot hold it; Writer.MaxOutputBytes is the limit in force.
	MaxOutputBytes int
	// MaxBatchEntries bounds the entries packed into one message, and so the entries
	// one Write may carry (default 256).
	MaxBatchEntries int
	// StallTimeout is how long the applier may go without applying a message or seeing
	// that it has applied the stream's last one before its consumer is presumed silent
	// and recreated (default 10s).
	StallTimeout time.Duration
	// Supervisor keeps the applier's consumer alive (internal/base/supervise); nil: a
	// supervisor of the Applier's own.
	Supervisor *supervise.Supervisor
	// NoOwnApply leaves every message to the applier, including this node's own (for
	// benchmarks comparing the two). Default false.
	NoOwnApply bool
	// NoteDelay is how long a note (a Write of step starts and non-final failures only:
	// Writer.Write) waits for a write to ride with before it is published on its own
	// (default 5ms).
	NoteDelay time.Duration
	// PublishTimeout bounds the retries of one publish (default 10s).
	PublishTimeout time.Duration
	// Hooks are tests' switches (internal/base/testhooks: PassQueue, NoLogCheck, Deaf, FailApply, HoldApply); nil in
	// production.
	Hooks *testhooks.Hooks
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default set. Stream, Store and Node are the
// caller's to set.
func DefaultConfig() Config {
	return Config{
		MaxOutputBytes:  DefaultMaxOutputBytes,
		MaxBatchEntries: DefaultMaxBatchEntries,
		StallTimeout:    DefaultStallTimeout,
		NoteDelay:       DefaultNoteDelay,
		PublishTimeout:  DefaultPublishTimeout,
	}
}

// Validate reports the first field of c that the log cannot run with, naming the field
// and the fix (errors.Is(err, ErrInvalidConfig)). It changes nothing: c is a copy.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: Config.%s %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Stream == nil:
		return bad("Stream", "is nil: set it to the log (jsport.OpenStream)")
	case c.Store == nil:
		return bad("Store", "is nil: set it to the node's state (checkpoint.OpenStore)")
	case !ident.ValidID(c.Node):
		return bad("Node", "is %q, not a valid node ID: %s", c.Node, ident.IDRule)
	case c.MaxOutputBytes < 1:
		return bad("MaxOutputBytes", "is %d: set it above 0, or start from DefaultConfig (%d)", c.MaxOutputBytes, DefaultMaxOutputBytes)
	case c.MaxBatchEntries < 1:
		return bad("MaxBatchEntries", "is %d: set it above 0, or start from DefaultConfig (%d)", c.MaxBatchEntries, DefaultMaxBatchEntries)
	case c.StallTimeout <= 0:
		return bad("StallTimeout", "is %s: set it above 0, or start from DefaultConfig (%s)", c.StallTimeout, DefaultStallTimeout)
	case c.NoteDelay <= 0:
		return bad("NoteDelay", "is %s: set it above 0, or start from DefaultConfig (%s)", c.NoteDelay, DefaultNoteDelay)
	case c.PublishTimeout <= 0:
		return bad("PublishTimeout", "is %s: set it above 0, or start from DefaultConfig (%s)", c.PublishTimeout, DefaultPublishTimeout)
	}
	return nil
}

// logger is c.Logger, or one that discards.
func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}
