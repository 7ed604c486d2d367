package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

// The trust boundary (issue 15), with flowd's embedded server.

// authUsers is the --auth file of the tests: one user per role.
const authUsers = `users:
  - {user: vera, password: viewer-pw-7, role: viewer}
  - {user: otto, password: operator-pw-7, role: operator}
  - {user: ann, password: admin-pw-7, role: admin}
  - {user: nora, password: node-pw-7, role: node}
`

var authPasswords = map[string]string{"vera": "viewer-pw-7", "otto": "operator-pw-7", "ann": "admin-pw-7", "nora": "node-pw-7"}

// slowStep keeps its run running while the test forges its commit.
const slowStep = "name: slow\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 2m}\n"

// embeddedFlowd starts one flowd embedding its server on a loopback port, with extra
// flags, and returns it with its client URL and its HTTP address.
func embeddedFlowd(t *testing.T, extra ...string) (*Proc, string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	return embeddedFlowdBin(t, filepath.Join(Binaries(t), "flowd"), extra...)
}

// embeddedFlowdBin is embeddedFlowd with the flowd binary bin (one linked with a guard
// off: FlowdLinkedWith).
func embeddedFlowdBin(t *testing.T, bin string, extra ...string) (*Proc, string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	dir := t.TempDir()
	ports := freePorts(t, 2)
	logf, err := os.Create(filepath.Join(dir, "flowd.log"))
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	args := append([]string{bin, "--node-id", "node-a", "--data-dir", filepath.Join(dir, "data"),
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--http", httpAddr, "--log-format", "json", "--log-level", "debug", "--park-after", "24h"}, extra...)
	p := &Proc{Name: "node-a", log: logf, args: args}
	p.start(t)
	t.Cleanup(p.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("flowd:\n%s", tail(LogOf(p)))
		}
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	WaitFor(t, 60*time.Second, "flowd ready", func() bool { return strings.Contains(LogOf(p), "flowd ready") || !p.Alive() })
	if !p.Alive() {
		t.Fatalf("flowd exited at start")
	}
	return p, url, httpAddr
}

// dialAs is a client of url as user (no user: anonymous).
func dialAs(t *testing.T, url, user string) (*client.Client, error) {
	t.Helper()
	var opts []client.Option
	if user != "" {
		opts = append(opts, client.WithNATSOptions(nats.UserInfo(user, authPasswords[user])))
	}
	cl, err := client.Dial(url, opts...)
	if err == nil {
		t.Cleanup(cl.Close)
	}
	return cl, err
}

// forgeCompletion publishes, as user, a commit and a completion of run id's current
// epoch straight to the log (what anything that reaches NATS could do before issue 15),
// and says whether the server took it.
func forgeCompletion(t *testing.T, url, user, id string, r client.Run) error {
	t.Helper()
	opts := []nats.Option{nats.MaxReconnects(0)}
	if user != "" { // the answer (an ack) comes to the user's own inbox
		opts = append(opts, nats.UserInfo(user, authPasswords[user]), nats.CustomInboxPrefix(client.InboxPrefix(user)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	at := time.Now().UTC().Format(time.RFC3339Nano)
	msg := fmt.Sprintf(`{"v":1,"node":"forger","entries":[`+
		`{"k":"commit","run":%q,"epoch":%d,"owner":%q,"step":"a","item":-1,"output":{"paid_to":"forger"},"at":%q},`+
		`{"k":"complete","run":%q,"epoch":%d,"owner":%q,"status":"succeeded","at":%q}]}`,
		id, r.Epoch, r.Owner, at, id, r.Epoch, r.Owner, at)
	// A refused publish gets no ack: two seconds tell (an accepted one would show in the
	// run, which the caller checks).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.Publish(ctx, "flow.log", []byte(msg))
	return err
}

// runningRun starts the slow workflow's run id as cl and waits until it runs.
func runningRun(t *testing.T, cl *client.Client, id string) client.Run {
	t.Helper()
	ctx := logCtx(t)
	if _, err := cl.ApplyWorkflow(ctx, "slow.yaml", []byte(slowStep)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.StartRun(ctx, "slow", client.StartOptions{ID: id}); err != nil {
		t.Fatal(err)
	}
	var r client.Run
	WaitFor(t, 60*time.Second, "run "+id+" running", func() bool {
		got, err := cl.Run(ctx, id)
		r = got
		return err == nil && got.Status == "running" && got.Owner != ""
	})
	return r
}

// With --auth, an operator's forged commit to the log and its JetStream delete of the
// log are refused by the server, and nothing changes. Control: without --auth, the same
// forgery completes the run with a forged output (what the boundary protects).
func TestForgedCommitNeedsTheNodeRole(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, auth := range []bool{true, false} {
		t.Run(map[bool]string{true: "auth", false: "control-no-auth"}[auth], func(t *testing.T) {
			var extra []string
			forger := ""
			if auth {
				file := filepath.Join(t.TempDir(), "users.yaml")
				if err := os.WriteFile(file, []byte(authUsers), 0o600); err != nil {
					t.Fatal(err)
				}
				extra, forger = []string{"--auth", file}, "otto"
			}
			_, url, _ := embeddedFlowd(t, extra...)
			cl, err := dialAs(t, url, forger)
			if err != nil {
				t.Fatal(err)
			}
			r := runningRun(t, cl, "victim")
			err = forgeCompletion(t, url, forger, "victim", r)
			ctx := logCtx(t)
			if !auth {
				if err != nil {
					t.Fatalf("control: the forgery was not even published: %v", err)
				}
				WaitFor(t, 30*time.Second, "the forged completion to be applied", func() bool {
					got, err := cl.Run(ctx, "victim")
					return err == nil && got.Status == "succeeded"
				})
				return
			}
			if err == nil {
				t.Fatal("the server took an operator's publish to flow.log")
			}
			// The JetStream API that deletes the log: refused too.
			nc, err := nats.Connect(url, nats.UserInfo("otto", authPasswords["otto"]), nats.CustomInboxPrefix(client.InboxPrefix("otto")), nats.MaxReconnects(0))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second) // refused: no answer comes
			defer cancel()
			if err := js.DeleteStream(dctx, "FLOW_LOG"); err == nil {
				t.Fatal("the server let an operator delete the log")
			}
			viewer, err := dialAs(t, url, "vera") // a node may not call the API (issue 24)
			if err != nil {
				t.Fatal(err)
			}
			got, err := viewer.Run(ctx, "victim")
			if err != nil || got.Status != "running" || got.Epoch != r.Epoch {
				t.Fatalf("after the refused forgery the run is %+v (%v)", got, err)
			}
			st, err := viewer.ClusterStatus(ctx)
			if err != nil || st.LastSeq == 0 {
				t.Fatalf("the log after the refused delete: %+v %v", st, err)
			}
		})
	}
}

// With --auth: anonymous and wrong passwords are refused at connect; each role may do
// what it may; an operator's actions are in the history with its name; no password
// reaches flowd's log or /metrics; the data dir is private.
func TestAuthRolesWithTheEmbeddedServer(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	file := filepath.Join(t.TempDir(), "users.yaml")
	if err := os.WriteFile(file, []byte(authUsers), 0o600); err != nil {
		t.Fatal(err)
	}
	p, url, httpAddr := embeddedFlowd(t, "--auth", file, "--lease-ttl", "1s")
	if _, err := dialAs(t, url, ""); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatal("an anonymous connection was accepted")
	}
	if _, err := client.Dial(url, client.WithNATSOptions(nats.UserInfo("otto", "wrong"))); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatal("a wrong password was accepted")
	}
	ctx := logCtx(t)
	operator, err := dialAs(t, url, "otto")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.ApplyWorkflow(ctx, "one.yaml", []byte(oneStep)); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.StartRun(ctx, "one", client.StartOptions{ID: "by-otto"}); err != nil {
		t.Fatal(err)
	}
	viewer, err := dialAs(t, url, "vera")
	if err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 60*time.Second, "the run to succeed, seen by the viewer", func() bool {
		r, err := viewer.Run(ctx, "by-otto")
		return err == nil && r.Status == "succeeded"
	})
	events, err := viewer.History(ctx, "by-otto")
	if err != nil || len(events) == 0 || events[0].Kind != "submit" || events[0].Actor != "otto" {
		t.Fatalf("the submit's actor in the history: %+v %v", events, err)
	}
	// Each role with flowctl: what it may do is done; what it may not is exit 4, names
	// the role it needs, and changes nothing in the log.
	lastSeq := func() uint64 {
		st, err := viewer.ClusterStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.LastSeq
	}
	as := func(user string, args ...string) (int, string) {
		return flowctl(url, append([]string{"--user", user, "--password", authPasswords[user]}, args...)...)
	}
	for _, c := range []struct {
		user string
		args []string
		need string // "": allowed
	}{
		{"vera", []string{"run", "list"}, ""},
		{"vera", []string{"run", "start", "one", "--id", "by-vera"}, "operator"},
		{"vera", []string{"cluster", "snapshot"}, "operator"},
		{"vera", []string{"dlq", "purge", "by-otto"}, "admin"},
		{"otto", []string{"run", "start", "one", "--id", "by-otto-2", "--wait"}, ""},
		{"otto", []string{"dlq", "purge", "by-otto"}, "admin"},
		{"otto", []string{"drill", "zombie"}, "admin"},
		{"ann", []string{"drill", "zombie"}, ""},
	} {
		before := lastSeq()
		code, out := as(c.user, c.args...)
		switch {
		case c.need == "" && code != 0:
			t.Errorf("%s: %v: exit %d: %s", c.user, c.args, code, out)
		case c.need != "" && (code != 4 || !strings.Contains(out, c.need+" role")):
			t.Errorf("%s: %v: exit %d, want 4 naming the %s role: %s", c.user, c.args, code, c.need, out)
		case c.need != "" && lastSeq() != before:
			t.Errorf("%s: %v was refused but the log moved from %d to %d", c.user, c.args, before, lastSeq())
		}
	}
	if _, err := viewer.Run(ctx, "by-vera"); !isNotFound(err) {
		t.Fatalf("the viewer's run exists: %v", err)
	}
	if code, out := flowctl(url, "run", "list"); code != 4 {
		t.Errorf("anonymous flowctl: exit %d: %s", code, out)
	}
	if code, out := flowctl(url, "--user", "otto", "--password", "wrong", "run", "list"); code != 4 {
		t.Errorf("a wrong password: exit %d: %s", code, out)
	}
	// Another flowd joins with the node role's credentials (the password from the
	// environment, as docs/security.md says).
	nb := StartFlowdEnv(t, &Cluster{URLs: []string{url}}, "node-b", []string{"FLOWD_NATS_PASSWORD=" + authPasswords["nora"]}, "--nats-user", "nora")
	WaitFor(t, 60*time.Second, "node-b in the cluster", func() bool {
		st, err := viewer.ClusterStatus(ctx)
		return err == nil && len(st.Nodes) == 2
	})
	// Passwords are nowhere in the log or the metrics.
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for user, pw := range authPasswords {
		if strings.Contains(LogOf(p), pw) || strings.Contains(LogOf(nb), pw) || strings.Contains(string(metrics), pw) {
			t.Errorf("%s's password is in flowd's log or /metrics", user)
		}
	}
	// The data dir is this user's only: no file or directory others may read.
	dataDir := p.args[slicesIndex(p.args, "--data-dir")+1]
	_ = filepath.Walk(dataDir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %s", path, fi.Mode().Perm())
		}
		return nil
	})
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == client.CodeNotFound
}
