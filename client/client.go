package client

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowrun/flow/internal/base/resend"
)

// ErrUnreachable: no flowd answered (flowctl exits 3). Test it with errors.Is.
var ErrUnreachable = errors.New("flow server unreachable")

// Error is an error the server returned: Code is one of the Code* constants.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is makes an Error with CodeForbidden ErrNotAuthorized.
func (e *Error) Is(target error) bool { return target == ErrNotAuthorized && e.Code == CodeForbidden }

// Defaults of a Client.
const (
	// DefaultTimeout bounds a whole call, retries included.
	DefaultTimeout = 2 * time.Minute
	// DefaultAttemptTimeout bounds one try of a read-only call (a start's try gets twice
	// as long, a run.wait's its wait and as long again).
	DefaultAttemptTimeout = 3 * time.Second
)

// Client calls a flow cluster over NATS. It is safe for concurrent use.
type Client struct {
	nc             *nats.Conn
	own            bool // Dial made nc: Close closes it
	timeout        time.Duration
	attemptTimeout time.Duration
	natsOptions    []nats.Option
	// keepDenials leaves permissions violations unmapped in the handler Dial installs:
	// only the tests set it (withoutDenialMapping), to show that the handler is what
	// turns a refused call into ErrNotAuthorized rather than a timeout.
	keepDenials bool
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds a whole call, retries included (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithAttemptTimeout bounds one try of a read-only call (default DefaultAttemptTimeout).
// Any node may get a request, including a paused or dying one that will not answer: a
// read-only call is then tried again and reaches another; so are run.wait and run.start
// with longer tries (a start's tries are one start: its run ID is fixed before the first).
func WithAttemptTimeout(d time.Duration) Option { return func(c *Client) { c.attemptTimeout = d } }

// WithNATSOptions adds options to the connection Dial makes (credentials, TLS, ...). An
// error handler given here (nats.ErrorHandler) still gets every asynchronous error,
// after the client's own (see Dial).
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
//
// The answers to its requests come under InboxPrefix of the user the credentials name
// (a user and password, an nkey, a credentials file's JWT, or a user in the URL), which
// is what a person's permissions let them read; a nats.CustomInboxPrefix given with
// WithNATSOptions wins.
//
// A server that refuses the credentials (wrong, missing or expired ones) makes a
// *NotAuthorizedError (errors.Is ErrNotAuthorized); any other failure to connect,
// a failed TLS handshake included, is ErrUnreachable. Errors never show a URL's
// password.
//
// Dial installs ErrorHandler as the connection's asynchronous error handler, so that a
// call the server refuses for this user ends at once with a *NotAuthorizedError rather
// than waiting for its timeout. A handler given with WithNATSOptions is chained after
// it and sees every error; without one, the errors the client does not act on are
// dropped (nats.go's default handler would print them on stderr).
func Dial(url string, opts ...Option) (*Client, error) {
	c := newClient(nil, opts)
	nopts := append([]nats.Option{nats.Name("flow-client"), nats.Timeout(2 * time.Second), nats.MaxReconnects(0)}, c.natsOptions...)
	// Answers come under this user's own prefix, the only inbox a person's permissions
	// let them read (InboxPrefix), unless the options chose one.
	if prefix, ok := inboxFor(url, nopts); ok {
		nopts = append(nopts, nats.CustomInboxPrefix(prefix))
	}
	// Last, so that it wraps whatever handler the options above set.
	nopts = append(nopts, func(o *nats.Options) error {
		o.AsyncErrorCB = errorHandler(o.AsyncErrorCB, !c.keepDenials)
		return nil
	})
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		if authError(err) {
			return nil, &NotAuthorizedError{Server: redact(url), Err: err}
		}
		if tlsFailure(err) {
			if !errors.Is(err, nats.ErrTLS) { // TLS 1.3: the server's alert came after the handshake
				err = fmt.Errorf("%w: %w", nats.ErrTLS, err)
			}
			return nil, fmt.Errorf("%w: %s: %w (the TLS handshake failed)", ErrUnreachable, redact(url), err)
		}
		return nil, fmt.Errorf("%w: %s: %v (is flowd running? set --server or FLOW_SERVER)", ErrUnreachable, redact(url), err)
	}
	c.nc, c.own = nc, true
	return c, nil
}

// tlsFailure says whether a connect failed in TLS: the handshake (nats.ErrTLS), or,
// with TLS 1.3, the server's alert after it (a *net.OpError "remote error", as
// crypto/tls reports it), when the server refused the client's certificate or the lack
// of one. Which of the two comes is a race between the client's first write and the
// alert.
func tlsFailure(err error) bool {
	var verr *tls.CertificateVerificationError
	var oerr *net.OpError
	return errors.Is(err, nats.ErrTLS) || errors.As(err, &verr) || (errors.As(err, &oerr) && oerr.Op == "remote error") ||
		errors.Is(err, nats.ErrSecureConnWanted) || errors.Is(err, nats.ErrSecureConnRequired)
}

// New uses an existing connection, which Close leaves open. New leaves the connection's
// error handler as it is: for a call the server refuses for this user to end at once as
// ErrNotAuthorized, the connection's handler must be (or call) ErrorHandler; without it
// such a call waits for its timeout and ends as ErrUnreachable.
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
	"run.history": true, "run.verify": true, "run.logs": true, "dlq.list": true, "dlq.show": true, "cron.list": true, "cron.next": true, "cluster.status": true,
	"limits": true,
}

// defaultWait is run.wait's bound when the request names none (the server's default).
const defaultWait = 30 * time.Second

// tryLimit is how long one try of op waits for its answer before the call sends it
// again, and 0 for an operation that is never sent again (its one try has the whole
// call's time). A request can vanish without an answer: NATS may hand it to a node that
// is dying (SIGKILLed, partitioned) before its subscription is gone. Reads are sent
// again; so is run.wait (a read that waits: its own bound, then a try's) and run.start,
// whose tries are one start (internal/base/resend: its ID is fixed before the first
// try, and a node answers a later try with the run the first one started). Other
// writes are not: a cancel, a retry or an apply sent twice could act twice.
func (c *Client) tryLimit(op string, req Request) time.Duration {
	switch {
	case readOnly[op]:
		return c.attemptTimeout
	case op == "run.wait":
		wait, err := time.ParseDuration(req.Wait)
		if err != nil || wait <= 0 {
			wait = defaultWait
		}
		return wait + c.attemptTimeout
	case op == "run.start":
		return 2 * c.attemptTimeout // a write: its log append may take a while under load
	}
	return 0
}

// call sends req (its V is set) to op and decodes the answer into out.
func (c *Client) call(ctx context.Context, op string, req Request, out any) error {
	return c.callWith(ctx, op, req, "", out)
}

// callWith is call with a start's nonce (internal/base/resend), sent in a header.
func (c *Client) callWith(ctx context.Context, op string, req Request, nonce string, out any) error {
	req.V = Version
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("flow client: encode %s: %w", op, err)
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m := &nats.Msg{Subject: Subject + "." + op, Data: data, Header: nats.Header{}}
	if nonce != "" {
		m.Header.Set(resend.HeaderNonce, nonce)
	}
	limit := c.tryLimit(op, req)
	var msg *nats.Msg
	for try := 1; ; try++ {
		if try > 1 {
			m.Header.Set(resend.HeaderTry, strconv.Itoa(try))
		}
		msg, err = c.try(ctx, op, m, limit)
		var nae *NotAuthorizedError
		if errors.As(err, &nae) {
			return err
		}
		// Only a try that went unanswered is sent again (to whichever node gets it
		// next); any other failure (no responders, a closed connection) is the answer.
		if err == nil || limit == 0 || ctx.Err() != nil || !unanswered(err) {
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

// try sends one request, waiting at most limit (0: as long as ctx) for its answer.
// While it waits, it is registered under its subject so that the connection's error
// handler (ErrorHandler) can end it when the server refuses this user the subject: the
// server then sends the request nowhere, and only says so in an asynchronous error.
// Such a try returns the *NotAuthorizedError.
func (c *Client) try(ctx context.Context, op string, m *nats.Msg, limit time.Duration) (*nats.Msg, error) {
	dctx, deny := context.WithCancelCause(ctx)
	defer deny(nil)
	forget := register(c.nc, m.Subject, op, deny)
	defer forget()
	rctx := dctx
	if limit > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(dctx, limit)
		defer cancel()
	}
	msg, err := c.nc.RequestMsgWithContext(rctx, m)
	var nae *NotAuthorizedError
	if err != nil && errors.As(context.Cause(dctx), &nae) {
		return nil, nae
	}
	return msg, err
}

// unanswered reports whether a request's error means no answer came in time.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// inboxFor is the inbox prefix of the user opts (and urls) sign in as, and false when
// the options set one themselves. A user and password, an nkey or a credentials file
// name the user; so does a user with a password in the first URL (nats://user:pw@host).
func inboxFor(urls string, opts []nats.Option) (string, bool) {
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if opt(&o) != nil {
			return "", false // Connect reports it
		}
	}
	if o.InboxPrefix != "" {
		return "", false
	}
	return InboxPrefix(userOf(urls, &o)), true
}

// userOf is the user opts sign in as, as the server names it: a user name, or the
// public key of an nkey or of a credentials file's JWT; "" for none (anonymous, a token).
func userOf(urls string, o *nats.Options) string {
	switch {
	case o.User != "":
		return o.User
	case o.Nkey != "":
		return o.Nkey
	case o.UserJWT != nil:
		if jwt, err := o.UserJWT(); err == nil {
			return jwtSubject(jwt)
		}
		return ""
	}
	first, _, _ := strings.Cut(urls, ",")
	if u, err := url.Parse(strings.TrimSpace(first)); err == nil && u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword {
			return u.User.Username()
		}
	}
	return ""
}

// jwtSubject is a JWT's "sub" claim (a user JWT's: the user's public key), read without
// checking the signature (the server does that); "" if it has none.
func jwtSubject(jwt string) string {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if json.Unmarshal(raw, &claims) != nil {
		return ""
	}
	return claims.Sub
}
