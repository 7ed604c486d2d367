package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ErrUnreachable: no flowd answered (flowctl exits 3). Test it with errors.Is.
var ErrUnreachable = errors.New("flow server unreachable")

// Error is an error the server returned: Code is one of the Code* constants.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Defaults of a Client.
const (
	// DefaultTimeout bounds a whole call, retries included.
	DefaultTimeout = 2 * time.Minute
	// DefaultAttemptTimeout bounds one try of a read-only call.
	DefaultAttemptTimeout = 3 * time.Second
)

// Client calls a flow cluster over NATS. It is safe for concurrent use.
type Client struct {
	nc             *nats.Conn
	own            bool // Dial made nc: Close closes it
	timeout        time.Duration
	attemptTimeout time.Duration
	natsOptions    []nats.Option
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds a whole call, retries included (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithAttemptTimeout bounds one try of a read-only call (default DefaultAttemptTimeout).
// Any node may get a request, including a paused one that will not answer: a read-only
// call is then tried again and reaches another.
func WithAttemptTimeout(d time.Duration) Option { return func(c *Client) { c.attemptTimeout = d } }

// WithNATSOptions adds options to the connection Dial makes (credentials, TLS, ...).
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *Client) { c.natsOptions = append(c.natsOptions, opts...) }
}

func newClient(nc *nats.Conn, opts []Option) *Client {
	c := &Client{nc: nc}
	for _, o := range opts {
		o(c)
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.attemptTimeout <= 0 {
		c.attemptTimeout = DefaultAttemptTimeout
	}
	return c
}

// Dial connects to the NATS URL (or comma-separated URLs) where flowd serves.
func Dial(url string, opts ...Option) (*Client, error) {
	c := newClient(nil, opts)
	nopts := append([]nats.Option{nats.Name("flow-client"), nats.Timeout(2 * time.Second), nats.MaxReconnects(0)}, c.natsOptions...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v (is flowd running? set --server or FLOW_SERVER)", ErrUnreachable, url, err)
	}
	c.nc, c.own = nc, true
	return c, nil
}

// New uses an existing connection, which Close leaves open.
func New(nc *nats.Conn, opts ...Option) *Client { return newClient(nc, opts) }

// Close closes the connection Dial made.
func (c *Client) Close() {
	if c.own {
		c.nc.Close()
	}
}

// readOnly operations may be retried: any node answers them alike.
var readOnly = map[string]bool{
	"workflow.list": true, "workflow.show": true, "workflow.validate": true, "run.get": true, "run.list": true,
	"run.history": true, "run.verify": true, "dlq.list": true, "dlq.show": true, "cron.list": true, "cluster.status": true,
}

// call sends req (its V is set) to op and decodes the answer into out.
func (c *Client) call(ctx context.Context, op string, req Request, out any) error {
	req.V = Version
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("flow client: encode %s: %w", op, err)
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var msg *nats.Msg
	for {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if readOnly[op] {
			actx, acancel = context.WithTimeout(ctx, cmp.Or(c.attemptTimeout, DefaultAttemptTimeout))
		}
		msg, err = c.nc.RequestWithContext(actx, Subject+"."+op, data)
		acancel()
		// Only a read whose try went unanswered is sent again (to whichever node gets
		// it next); any other failure (no responders, a closed connection) is the answer.
		if err == nil || !readOnly[op] || ctx.Err() != nil || !unanswered(err) {
			break
		}
	}
	if err != nil {
		if cerr := caller.Err(); cerr != nil { // the caller's own context ended: its error, not ours
			return fmt.Errorf("flow client: %s: %w", op, cerr)
		}
		if errors.Is(err, nats.ErrNoResponders) || unanswered(err) {
			return fmt.Errorf("%w: no flowd answered %s: %v", ErrUnreachable, op, err)
		}
		return fmt.Errorf("%w: %s: %v", ErrUnreachable, op, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &Error{Code: code, Message: msg.Header.Get(micro.ErrorHeader)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("flow client: the server's answer to %s does not decode: %w", op, err)
	}
	return nil
}

// unanswered reports whether a request's error means no answer came in time.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
