package natsnode

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/flowrun/flow/client"
)

// startAuth starts an embedded server with auth, listening on loopback, and these users.
func startAuth(t *testing.T, users ...User) *Server {
	t.Helper()
	s, err := Start(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NoSync: true, Auth: true, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// permissionErrors connects with opts and collects the server's permission violations.
func connectAs(t *testing.T, s *Server, opts ...nats.Option) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// inboxOf is the inbox option of user's connections (client.Dial sets it by itself).
func inboxOf(user string) nats.Option { return nats.CustomInboxPrefix(client.InboxPrefix(user)) }

func violation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("want a permissions violation on %s, got %v", subject, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the server did not refuse the publish to %s", subject)
	}
}

// With auth, the server refuses anonymous and wrong credentials; flowd's own in-process
// connection needs none; a node's user reaches flow's streams; a person's user may call
// exactly its role's operations and nothing of the log or JetStream, and its requests
// reach flow's account with the server's word on who sent them.
func TestAuthRolesAndIdentity(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	hash, err := bcrypt.GenerateFromPassword([]byte("b-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	s := startAuth(t,
		User{Name: "bea", Password: string(hash), Role: "viewer"},
		User{Name: "vera", Password: "v-secret", Role: "viewer"},
		User{Name: "otto", Password: "o-secret", Role: "operator"},
		User{Name: "nora", Password: "n-secret", Role: "node"},
		User{NKey: pub, Role: "operator"},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// flowd's own connection: no password given, full rights.
	own, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	js, _ := jetstream.New(own)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOW_LOG", Subjects: []string{"flow.log"}}); err != nil {
		t.Fatal(err)
	}
	// The API's responder, in flow's account, answers with who asked.
	sub, err := own.Subscribe("flow.v1.>", func(m *nats.Msg) {
		var info struct {
			User    string `json:"user"`
			Account string `json:"acc"`
		}
		_ = json.Unmarshal([]byte(m.Header.Get("Nats-Request-Info")), &info)
		_ = m.Respond([]byte(info.User + "@" + info.Account))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = own.Flush()

	for _, bad := range []nats.Option{nats.UserInfo("otto", "wrong"), nats.UserInfo("nobody", "x"), nats.Name("anonymous")} {
		if nc, err := nats.Connect(s.ClientURL(), bad, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("a connection without valid credentials was accepted")
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("refused with %v, want an authorization violation", err)
		}
	}

	// A node's user: the same account as flowd, the log's stream is there.
	node, _ := connectAs(t, s, nats.UserInfo("nora", "n-secret"))
	njs, _ := jetstream.New(node)
	if _, err := njs.Stream(ctx, "FLOW_LOG"); err != nil {
		t.Fatalf("a node's user cannot see the log: %v", err)
	}

	// An operator: its operations answer, with its name as the server says it.
	op, opErrs := connectAs(t, s, nats.UserInfo("otto", "o-secret"), inboxOf("otto"))
	m, err := op.Request("flow.v1.run.start", []byte("{}"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.Data); got != "otto@"+UsersAccount {
		t.Fatalf("the responder saw the requester as %q", got)
	}
	// A forged identity header is replaced by the server's.
	forged := nats.NewMsg("flow.v1.run.cancel")
	forged.Header.Set("Nats-Request-Info", `{"user":"admin","acc":"$G"}`)
	if m, err = op.RequestMsg(forged, 10*time.Second); err != nil || string(m.Data) != "otto@"+UsersAccount {
		t.Fatalf("forged identity: %q %v", m.Data, err)
	}
	// ... but not an admin's, the log or the JetStream API.
	for _, subject := range []string{"flow.v1.dlq.purge", "flow.log", "$JS.API.STREAM.DELETE.FLOW_LOG", "$KV.FLOW_LEADER.leader"} {
		if err := op.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		violation(t, opErrs, subject)
	}
	if info, err := js.Stream(ctx, "FLOW_LOG"); err != nil || info.CachedInfo().State.Msgs != 0 {
		t.Fatalf("the log after the operator's tries: %v", err)
	}

	// A bcrypt password works as the plain one.
	connectAs(t, s, nats.UserInfo("bea", "b-secret"))
	// A viewer may not start a run; an nkey operator may.
	viewer, viewerErrs := connectAs(t, s, nats.UserInfo("vera", "v-secret"), inboxOf("vera"))
	if err := viewer.Publish("flow.v1.run.start", nil); err != nil {
		t.Fatal(err)
	}
	violation(t, viewerErrs, "flow.v1.run.start")
	if _, err := viewer.Request("flow.v1.run.get", nil, 10*time.Second); err != nil {
		t.Fatalf("a viewer's read: %v", err)
	}
	seed, _ := kp.Seed()
	nkeyOpt := nats.Nkey(pub, func(nonce []byte) ([]byte, error) {
		k, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		return k.Sign(nonce)
	})
	nk, _ := connectAs(t, s, nkeyOpt, inboxOf(pub))
	if m, err := nk.Request("flow.v1.run.retry", nil, 10*time.Second); err != nil || !strings.HasSuffix(string(m.Data), "@"+UsersAccount) {
		t.Fatalf("an nkey operator's request: %q %v", m.Data, err)
	}
}

// Users that cannot work are refused at start, naming the user (never its password).
func TestAuthBadUsers(t *testing.T) {
	for name, u := range map[string]User{
		"role":     {Name: "a", Password: "pw-1", Role: "root"},
		"both":     {Name: "a", Password: "pw-1", NKey: "UABC", Role: "viewer"},
		"nothing":  {Role: "viewer"},
		"bad nkey": {NKey: "SUAAAA", Role: "viewer"},
	} {
		_, err := Start(Config{DataDir: t.TempDir(), Auth: true, Users: []User{u}})
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), "pw-1") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// flow's streams are in the server's global account with auth or without: turning auth
// on keeps the log, and off again too.
func TestAuthKeepsTheStreams(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, auth := range []bool{false, true, false} {
		s, err := Start(Config{DataDir: dir, NoSync: true, Auth: auth})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := s.Connect()
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		if i == 0 {
			_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOW_LOG", Subjects: []string{"flow.log"}})
		}
		if err == nil {
			_, err = js.Publish(ctx, "flow.log", []byte("entry"))
		}
		var msgs uint64
		if err == nil {
			var st jetstream.Stream
			if st, err = js.Stream(ctx, "FLOW_LOG"); err == nil {
				msgs = st.CachedInfo().State.Msgs
			}
		}
		nc.Close()
		s.Shutdown()
		if err != nil || msgs != uint64(i+1) {
			t.Fatalf("start %d (auth %v): %d messages, %v", i+1, auth, msgs, err)
		}
	}
}

// URLs go to logs and errors without their user information.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                          "nats://127.0.0.1:4222",
		"nats://otto:s3cret@h1:4222,tls://tok3n@h2:4222": "nats://h1:4222,tls://h2:4222",
		"nats://otto:s3cret@h1:4222, nats://h2:4222":     "nats://h1:4222, nats://h2:4222",
		"nats://otto:s%zz@h1:4222":                       "(redacted)@h1:4222",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := Connect("nats://otto:s3cret@127.0.0.1:1", "test", nats.MaxReconnects(0), nats.Timeout(200*time.Millisecond)); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a failed connect says %v", err)
	}
}
