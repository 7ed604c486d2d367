package api

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

// ErrUnreachable: no flowd answered (flowctl exits 3).
var ErrUnreachable = errors.New("flow server unreachable")

// Error is an error the server returned.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Client calls the API.
type Client struct {
	nc *nats.Conn
	// Timeout bounds a whole call, retries included.
	Timeout time.Duration
	// AttemptTimeout bounds one try of a read-only call (default 3s). Any node of the
	// queue group may get a request, including a paused one that will not answer: a
	// retry reaches another.
	AttemptTimeout time.Duration
}

// Dial connects to a NATS URL where flowd serves.
func Dial(url string) (*Client, error) {
	nc, err := nats.Connect(url, nats.Name("flowctl"), nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v (is flowd running? set --server or FLOW_SERVER)", ErrUnreachable, url, err)
	}
	return &Client{nc: nc, Timeout: 2 * time.Minute}, nil
}

// NewClient uses an existing connection.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc, Timeout: 2 * time.Minute} }

// Close closes the connection.
func (c *Client) Close() { c.nc.Close() }

// readOnly operations may be retried: any node answers them alike.
var readOnly = map[string]bool{
	"workflow.list": true, "workflow.show": true, "workflow.validate": true, "run.get": true, "run.list": true,
	"run.history": true, "run.verify": true, "dlq.list": true, "dlq.show": true, "cron.list": true, "cluster.status": true,
}

// defaultAttemptTimeout is the Client's AttemptTimeout when unset.
const defaultAttemptTimeout = 3 * time.Second

// Call sends req (its V is set) to op and decodes the answer into out.
func (c *Client) Call(ctx context.Context, op string, req Req, out any) error {
	req.V = Version
	data, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var msg *nats.Msg
	var err error
	for {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if readOnly[op] {
			actx, acancel = context.WithTimeout(ctx, cmp.Or(c.AttemptTimeout, defaultAttemptTimeout))
		}
		msg, err = c.nc.RequestWithContext(actx, Subject+"."+op, data)
		acancel()
		if err == nil || !readOnly[op] || ctx.Err() != nil || errors.Is(err, nats.ErrNoResponders) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("%w: no flowd answered %s: %v", ErrUnreachable, op, err)
		}
		return fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &Error{Code: code, Message: msg.Header.Get(micro.ErrorHeader)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("flowctl: the server's answer to %s does not decode: %w", op, err)
	}
	return nil
}
