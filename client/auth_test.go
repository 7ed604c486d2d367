package client

// These tests run against a real nats-server, embedded, with users whose permissions are
// the roles' (PermissionsOf), as an external server configured from `flowctl auth
// permissions` would have them. A node-role connection answers the operations in place
// of flowd: what is under test is what the NATS server refuses and how the client
// reports it, not flowd.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/testnats"
	"github.com/flowrun/flow/internal/testkit/within"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// passwords of the test server's users, one per role.
var passwords = map[string]string{RoleViewer: "viewer-secret", RoleOperator: "operator-secret", RoleNode: "node-secret"}

// serverPermissions is the Permissions of user of role as the server's options take them.
func serverPermissions(t *testing.T, role, user string) *server.Permissions {
	t.Helper()
	p, err := PermissionsOf(role, user)
	if err != nil {
		t.Fatal(err)
	}
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if p.Responses != nil {
		expires, err := time.ParseDuration(p.Responses.Expires)
		if err != nil {
			t.Fatal(err)
		}
		sp.Response = &server.ResponsePermission{MaxMsgs: p.Responses.Max, Expires: expires}
	}
	return sp
}

// startNATS starts an embedded nats-server on 127.0.0.1 with a user per role (named
// after it) and "blind", who may call workflow.list only; with users, it refuses
// anonymous connections. A node connection answers every operation (answers).
func startNATS(t *testing.T) string {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	for role, pw := range passwords {
		opts.Users = append(opts.Users, &server.User{Username: role, Password: pw, Permissions: serverPermissions(t, role, role)})
	}
	opts.Users = append(opts.Users, &server.User{Username: "blind", Password: "blind-secret", Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{Subject + ".workflow.list"}},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix("blind") + ".>"}},
	}})
	url := testnats.Server(t, opts).ClientURL()

	nc, err := nats.Connect(url, nats.UserInfo(RoleNode, passwords[RoleNode]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close) // before the server shuts down (cleanups run last first)
	if _, err := nc.Subscribe(Subject+".>", func(m *nats.Msg) {
		_ = m.Respond([]byte(answers[strings.TrimPrefix(m.Subject, Subject+".")]))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the subscription is in place before any call
		t.Fatal(err)
	}
	return url
}

// answers are the responder's answers, by operation.
var answers = map[string]string{"run.start": `{"id":"r-1"}`, "workflow.list": `[]`, "cluster.status": `{"leader":"n","term":1,"nodes":[]}`}

func dialAs(t *testing.T, url, user string, opts ...Option) *Client {
	t.Helper()
	pw := passwords[user]
	if user == "blind" {
		pw = "blind-secret"
	}
	c, err := Dial(url, append([]Option{WithNATSOptions(nats.UserInfo(user, pw))}, opts...)...)
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// wantNotAuthorized fails unless err is ErrNotAuthorized for op (and not ErrUnreachable).
func wantNotAuthorized(t *testing.T, err error, op, role, what string) {
	t.Helper()
	var nae *NotAuthorizedError
	if !errors.Is(err, ErrNotAuthorized) || errors.Is(err, ErrUnreachable) || !errors.As(err, &nae) {
		t.Fatalf("%s: %v (%T); want ErrNotAuthorized, not ErrUnreachable", what, err, err)
	}
	if nae.Op != op || nae.Role != role || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("%s: %+v; want op %s, role %s, unwrapping to nats.ErrPermissionViolation", what, nae, op, role)
	}
	want := fmt.Sprintf("not authorized: %s needs the %s role (or higher); ask an admin for credentials with that role", op, role)
	if err.Error() != want {
		t.Fatalf("%s: message %q, want %q", what, err.Error(), want)
	}
}

// A call the server refuses for this user ends as ErrNotAuthorized naming the operation
// and the role it needs; allowed calls on the same connection go on working, at the
// same time as refused ones.
func TestNotAuthorized(t *testing.T) {
	url := startNATS(t)
	ctx := ctxFor(t, 30*time.Second)
	// A generous whole timeout: were the refusal not mapped, the call would end by it
	// and the test fail on ErrUnreachable (TestDenialMappingIsWhatEndsTheCall).
	viewer := dialAs(t, url, RoleViewer, WithTimeout(20*time.Second))
	_, err := viewer.StartRun(ctx, "hello", StartOptions{})
	wantNotAuthorized(t, err, "run.start", RoleOperator, "viewer starts a run")
	if _, err := viewer.PurgeDeadLetter(ctx, "r-1"); !errors.Is(err, ErrNotAuthorized) || !strings.Contains(err.Error(), "dlq.purge needs the admin role") {
		t.Fatalf("viewer purges: %v; want ErrNotAuthorized naming the admin role", err)
	}
	if ws, err := viewer.Workflows(ctx); err != nil || ws == nil {
		t.Fatalf("viewer lists workflows: %v %v", ws, err)
	}
	if id, err := dialAs(t, url, RoleOperator).StartRun(ctx, "hello", StartOptions{}); err != nil || id != "r-1" {
		t.Fatalf("operator starts a run: %q %v", id, err)
	}

	// A read is tried again when a try goes unanswered: a refused one is not (its tries
	// would all be refused), whatever the attempt timeout.
	blind := dialAs(t, url, "blind", WithTimeout(20*time.Second), WithAttemptTimeout(10*time.Second))
	_, err = blind.ClusterStatus(ctx)
	wantNotAuthorized(t, err, "cluster.status", RoleViewer, "blind reads the cluster's status")

	// Refused and allowed calls at once on one connection: a refusal names a subject
	// only, and ends the calls on that subject, no others.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		wg.Go(func() {
			if i%2 == 0 {
				_, err := viewer.StartRun(ctx, "hello", StartOptions{})
				if !errors.Is(err, ErrNotAuthorized) {
					errs <- fmt.Errorf("concurrent start: %v; want ErrNotAuthorized", err)
				}
				return
			}
			if _, err := viewer.Workflows(ctx); err != nil {
				errs <- fmt.Errorf("concurrent list: %v", err)
			}
		})
	}
	within.Group(t, 30*time.Second, &wg, "the concurrent calls")
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	pending.Lock()
	left := len(pending.calls)
	pending.Unlock()
	if left != 0 {
		t.Fatalf("%d subjects still registered after every call returned", left)
	}
}

// The server refusing the credentials at connect is ErrNotAuthorized, not ErrUnreachable:
// a wrong password, no credentials where the server has users. No password is shown.
func TestNotAuthorizedAtConnect(t *testing.T) {
	url := startNATS(t)
	port := url[strings.LastIndex(url, ":")+1:]
	for what, dial := range map[string]func() (*Client, error){
		"a wrong password":   func() (*Client, error) { return Dial(url, WithNATSOptions(nats.UserInfo(RoleViewer, "wrong-secret"))) },
		"anonymous":          func() (*Client, error) { return Dial(url) },
		"a password in URLs": func() (*Client, error) { return Dial("nats://viewer:wrong-secret@127.0.0.1:" + port) },
		"a token in the URL": func() (*Client, error) { return Dial("nats://wrong-secret@127.0.0.1:" + port) },
	} {
		c, err := dial()
		var nae *NotAuthorizedError
		if c != nil || !errors.Is(err, ErrNotAuthorized) || errors.Is(err, ErrUnreachable) || !errors.As(err, &nae) || nae.Op != "" {
			t.Fatalf("%s: %v %v; want ErrNotAuthorized (no operation), not ErrUnreachable", what, c, err)
		}
		if !errors.Is(err, nats.ErrAuthorization) || !strings.HasPrefix(err.Error(), "not authorized: nats://") {
			t.Fatalf("%s: %q; want the server's authorization violation, and the URL", what, err)
		}
		if strings.Contains(err.Error(), "wrong-secret") {
			t.Fatalf("%s: the error shows the password: %q", what, err)
		}
	}
}

// withoutDenialMapping leaves the handler Dial installs without its mapping of
// permissions violations.
func withoutDenialMapping() Option { return func(c *Client) { c.keepDenials = true } }

// The negative control: without the error handler's mapping, the refused call waits for
// an answer that cannot come and ends as ErrUnreachable when its time is up. The
// mapping is what makes it ErrNotAuthorized (and flowctl's exit code 4).
func TestDenialMappingIsWhatEndsTheCall(t *testing.T) {
	url := startNATS(t)
	c := dialAs(t, url, RoleViewer, withoutDenialMapping(), WithTimeout(500*time.Millisecond))
	_, err := c.StartRun(ctxFor(t, 30*time.Second), "hello", StartOptions{})
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotAuthorized) {
		t.Fatalf("a refused call without the mapping: %v; want ErrUnreachable after the timeout", err)
	}
}

// Dial chains a handler given with WithNATSOptions after its own: it still gets the
// permissions violation.
func TestDialChainsTheCallersErrorHandler(t *testing.T) {
	url := startNATS(t)
	seen := make(chan error, 4)
	c := dialAs(t, url, RoleViewer, WithNATSOptions(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case seen <- err:
		default:
		}
	})))
	ctx := ctxFor(t, 30*time.Second)
	if _, err := c.StartRun(ctx, "hello", StartOptions{}); !errors.Is(err, ErrNotAuthorized) {
		t.Fatalf("start: %v; want ErrNotAuthorized", err)
	}
	select {
	case err := <-seen:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), Subject+".run.start") {
			t.Fatalf("the caller's handler got %v; want the violation on run.start", err)
		}
	case <-ctx.Done():
		t.Fatal("the caller's handler never got the permissions violation")
	}
}

// A connection given to New maps refusals when its handler is ErrorHandler (any number
// of Clients sharing it); without, as New's documentation says, a refused call ends as
// ErrUnreachable after its timeout.
func TestNewWithAndWithoutTheErrorHandler(t *testing.T) {
	url := startNATS(t)
	ctx := ctxFor(t, 30*time.Second)
	nc, err := nats.Connect(url, nats.UserInfo(RoleViewer, passwords[RoleViewer]), nats.CustomInboxPrefix(InboxPrefix(RoleViewer)),
		nats.ErrorHandler(ErrorHandler(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := range 2 {
		_, err := New(nc, WithTimeout(20*time.Second)).StartRun(ctx, "hello", StartOptions{})
		wantNotAuthorized(t, err, "run.start", RoleOperator, fmt.Sprintf("client %d on the caller's connection", i))
	}

	bare, err := nats.Connect(url, nats.UserInfo(RoleViewer, passwords[RoleViewer]), nats.CustomInboxPrefix(InboxPrefix(RoleViewer)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // not nats.go's default, which prints
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := New(bare, WithTimeout(500*time.Millisecond)).StartRun(ctx, "hello", StartOptions{}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a refused call on a connection without ErrorHandler: %v; want ErrUnreachable after the timeout", err)
	}
}

func TestRedact(t *testing.T) {
	got := redact("nats://alice:pa55@h1:4222, nats://t0ken@h2:4222,nats://h3:4222")
	if strings.Contains(got, "pa55") || strings.Contains(got, "t0ken") || !strings.Contains(got, "alice") || !strings.Contains(got, "h3:4222") {
		t.Fatalf("redact: %q", got)
	}
}
