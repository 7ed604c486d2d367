// Package flowd runs a flow node, the flowd daemon, inside a program of your own: with
// flowd's flags, FLOWD_* environment and config file, and with step kinds of your own
// (Go steps registered on a steps.Registry). cmd/flowd is Main with the built-in kinds;
// examples/payout's nodes are Main with the payout's.
//
//	reg := steps.NewRegistry(0)
//	_ = reg.Register("payout", steps.Func(pay))
//	os.Exit(flowd.Main(os.Args[1:], flowd.WithSteps(reg)))
//
// To call the node from the same program, Start it instead and use Node.Client (package
// client); from anywhere else, dial Node.ClientURL with client.Dial.
package flowd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/daemon"
	"github.com/flowrun/flow/steps"
)

// Option adds what flowd's flags cannot say.
type Option func(*daemon.Embedding)

// WithSteps gives the node these step kinds (the registry's own, plus flowd's built-in
// kinds if the registry was made with steps.NewRegistry).
func WithSteps(reg *steps.Registry) Option {
	return func(e *daemon.Embedding) { e.Registry = reg }
}

// WithNow sets the clock that manual runs' {{ now }}, {{ today }} and {{ yesterday }}
// defaults are rendered at (tests pin it so that no test depends on today's date).
func WithNow(now func() time.Time) Option {
	return func(e *daemon.Embedding) { e.Now = now }
}

// WithLogOutput sends the node's logs (and configuration errors) to w instead of
// standard error.
func WithLogOutput(w io.Writer) Option {
	return func(e *daemon.Embedding) { e.Stderr = w }
}

func embedding(opts []Option) daemon.Embedding {
	var e daemon.Embedding
	for _, o := range opts {
		o(&e)
	}
	return e
}

// Main is the flowd command with args (without the program name): it starts the node,
// drains on SIGTERM or SIGINT, and returns the exit code: 0 after a drain (or --help), 1
// if the node could not start or cannot continue from the log it finds, 2 for bad
// configuration (docs/cli.md).
func Main(args []string, opts ...Option) int {
	return daemon.Run(args, embedding(opts))
}

// ErrNotStarted is returned (wrapped) by Start when the node did not start; the
// error's text says why, as flowd's log would.
var ErrNotStarted = errors.New("flowd: the node did not start")

// Node is a flowd node running in this process.
type Node struct {
	d *daemon.Daemon
}

// Start starts a node as flowd would with args, and returns it serving. Stop drains it.
// Its logs go to WithLogOutput's writer (default: standard error).
func Start(ctx context.Context, args []string, opts ...Option) (*Node, error) {
	d, _, code := daemon.Open(ctx, args, embedding(opts))
	if d == nil {
		return nil, fmt.Errorf("%w (exit code %d; its log says why)", ErrNotStarted, code)
	}
	return &Node{d: d}, nil
}

// ClientURL is the NATS URL clients reach the node at (client.Dial).
func (n *Node) ClientURL() string { return n.d.Engine().ClientURL() }

// Client is a client of the node on its own connection: no credentials, and nothing
// to close (Stop closes it).
func (n *Node) Client() *client.Client {
	nc, _, _ := n.d.Engine().API().Hosting() // the connection the node's API service is on
	return client.New(nc)
}

// HTTPAddr is where the node serves /healthz, /readyz, /metrics and /ui/ ("" if off).
func (n *Node) HTTPAddr() string { return n.d.HTTPAddr() }

// Stop drains the node: running runs are handed back, then it shuts down.
func (n *Node) Stop() { n.d.Stop() }
