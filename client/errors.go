package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// ErrNotAuthorized: the NATS server refused this user an operation, or refused the
// connection's credentials (flowctl exits 4). Test it with errors.Is; errors.As with a
// *NotAuthorizedError tells which operation and the role it needs.
var ErrNotAuthorized = errors.New("not authorized")

// NotAuthorizedError is the error of a call or a Dial the NATS server refused for this
// user. It is ErrNotAuthorized (errors.Is), and it unwraps to what the server said
// (nats.ErrPermissionViolation or nats.ErrAuthorization, ...).
type NotAuthorizedError struct {
	// Op is the operation refused ("run.start"), or "" when the server refused the
	// connection itself (bad, missing or expired credentials).
	Op string
	// Role is the least role Op needs (RoleFor), or "" with no Op.
	Role string
	// Server is the URL dialled (its password, if it had one, redacted), with no Op.
	Server string
	// Err is the NATS server's refusal.
	Err error
}

func (e *NotAuthorizedError) Error() string {
	switch {
	case e.Op == "":
		return fmt.Sprintf("not authorized: %s refused the connection's credentials (%v)", e.Server, e.Err)
	case e.Role == "":
		return fmt.Sprintf("not authorized: the server refused %s for this user (%v)", e.Op, e.Err)
	}
	return fmt.Sprintf("not authorized: %s needs the %s role (or higher); ask an admin for credentials with that role", e.Op, e.Role)
}

// Is makes a *NotAuthorizedError ErrNotAuthorized.
func (e *NotAuthorizedError) Is(target error) bool { return target == ErrNotAuthorized }

// Unwrap is the NATS server's refusal.
func (e *NotAuthorizedError) Unwrap() error { return e.Err }

// ErrorHandler returns a NATS asynchronous error handler that ends, at once and with a
// *NotAuthorizedError, the calls a permissions violation refused, then calls next (if
// not nil) with every error.
//
// Why it is needed: the NATS server answers a publish this user may not make with an
// asynchronous -ERR naming only the subject, and sends the request nowhere; nats.go
// reports it to the connection's error handler while the request keeps waiting for an
// answer that cannot come. This handler finds the calls waiting on that subject on
// that connection (every call registers its subject while it waits) and ends them.
//
// Dial installs it (chained before any handler given with WithNATSOptions). A
// connection given to New is the caller's, and New does not change its handler: install
// this one on it, e.g. nats.Connect(url, nats.ErrorHandler(client.ErrorHandler(mine))),
// or a refused call waits for its timeout and ends as ErrUnreachable. Any number of
// Clients may share the connection: one handler serves them all.
func ErrorHandler(next nats.ErrHandler) nats.ErrHandler {
	return errorHandler(next, true)
}

func errorHandler(next nats.ErrHandler, mapDenials bool) nats.ErrHandler {
	return func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if mapDenials {
			denyPending(nc, err)
		}
		if next != nil {
			next(nc, sub, err)
		}
	}
}

// publishViolation is how nats-server words a refused publish (client.go,
// pubPermissionViolation): `Permissions Violation for Publish to "SUBJECT"`, the subject
// quoted with Go's %q.
var publishViolation = regexp.MustCompile(`(?i)permissions violation for publish to ("(?:[^"\\]|\\.)*")`)

// pendingKey is a subject calls wait on, on one connection: a permissions violation
// names the subject only, and only the connection it came on knows it.
type pendingKey struct {
	nc      *nats.Conn
	subject string
}

type pendingCall struct {
	op     string
	cancel context.CancelCauseFunc
}

// pending holds the calls waiting for an answer, for every connection and Client in the
// process (the handler knows the connection, not the Client). An entry lives only while
// its call waits, so a closed connection leaves nothing behind.
var pending = struct {
	sync.Mutex
	calls map[pendingKey]map[*pendingCall]struct{}
}{calls: map[pendingKey]map[*pendingCall]struct{}{}}

// register records a call waiting on subject; the function it returns forgets it.
func register(nc *nats.Conn, subject, op string, cancel context.CancelCauseFunc) func() {
	key, call := pendingKey{nc, subject}, &pendingCall{op: op, cancel: cancel}
	pending.Lock()
	defer pending.Unlock()
	if pending.calls[key] == nil {
		pending.calls[key] = map[*pendingCall]struct{}{}
	}
	pending.calls[key][call] = struct{}{}
	return func() {
		pending.Lock()
		defer pending.Unlock()
		delete(pending.calls[key], call)
		if len(pending.calls[key]) == 0 {
			delete(pending.calls, key)
		}
	}
}

// denyPending ends every call waiting on the subject err says this connection may not
// publish to. Every one of them was refused, not only the one whose publish the error
// answers: permissions are per subject and per connection, so a publish to that subject
// on that connection is refused whichever call made it.
func denyPending(nc *nats.Conn, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := publishViolation.FindStringSubmatch(err.Error())
	if m == nil {
		denyInbox(nc, err)
		return
	}
	subject, uerr := strconv.Unquote(m[1])
	if uerr != nil {
		return
	}
	pending.Lock()
	defer pending.Unlock()
	for call := range pending.calls[pendingKey{nc, subject}] {
		call.cancel(&NotAuthorizedError{Op: call.op, Role: RoleFor(call.op), Err: err})
	}
}

// subscribeViolation is how nats-server words a refused subscription.
var subscribeViolation = regexp.MustCompile(`(?i)permissions violation for subscription to ("(?:[^"\\]|\\.)*")`)

// denyInbox ends every call waiting on nc when err is the server refusing nc the
// subscription its answers come to (under its inbox prefix): none of them can get one.
// It happens when the user's permissions name another inbox than the client uses (a
// person's permissions from before per-user inboxes, or a connection given to New
// without nats.CustomInboxPrefix(InboxPrefix(user))).
func denyInbox(nc *nats.Conn, err error) {
	m := subscribeViolation.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	subject, uerr := strconv.Unquote(m[1])
	prefix := cmp.Or(nc.Opts.InboxPrefix, "_INBOX")
	if uerr != nil || !strings.HasPrefix(subject, prefix+".") {
		return
	}
	why := fmt.Errorf("%w: the server does not let this user read its answers (%s): the user's permissions must allow subscribing to %s.> (flowctl auth permissions ROLE --user NAME prints them)", err, subject, prefix)
	pending.Lock()
	defer pending.Unlock()
	for key, calls := range pending.calls {
		if key.nc != nc {
			continue
		}
		for call := range calls {
			call.cancel(&NotAuthorizedError{Op: call.op, Err: why})
		}
	}
}

// authError says whether a connect's error is the server refusing the credentials:
// wrong or missing ones (anonymous where the server has users), or expired or revoked
// ones.
func authError(err error) bool {
	for _, target := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// redact hides the passwords of URLs (a comma-separated list, as Dial takes): an error
// message is printed, logged and pasted into tickets.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				parts[i] = u.Redacted()
			} else { // nats://TOKEN@host: nats.go sends a lone user name as a token
				u.User = url.User("xxxxx")
				parts[i] = u.String()
			}
		} else if err != nil && strings.Contains(p, "@") {
			parts[i] = "(an unparsable URL with credentials)" // it might hold a password
		}
	}
	return strings.Join(parts, ",")
}
