package clustertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/testcerts"
)

// Issue 24, parts 3 and 5: TLS on the embedded server, each person's answers under an
// inbox only they read, a node that cannot speak for a person, with real processes.

// oldInboxesFlowd and oldNodeRoleFlowd are flowd linked with one part each of the
// permissions from before per-user inboxes and the narrowed node role (natsnode's
// oldInboxes, oldNodeRole): each control switches off its guard alone.
func oldInboxesFlowd(t *testing.T) string {
	return FlowdLinkedWith(t, "github.com/flowrun/flow/internal/base/natsnode.oldInboxes=1")
}

func oldNodeRoleFlowd(t *testing.T) string {
	return FlowdLinkedWith(t, "github.com/flowrun/flow/internal/base/natsnode.oldNodeRole=1")
}

// usersFile writes the tests' --auth file (authUsers) and returns its path.
func usersFile(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "users.yaml")
	if err := os.WriteFile(file, []byte(authUsers), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// A TCP proxy between flowctl and flowd's embedded server records every byte: with TLS
// on the client port (--nats-tls-cert, --nats-tls-key) it sees no password, no
// CONNECT, no answer; flowctl works through it with --tls-ca. Negative control: the
// same without TLS, the proxy's record holds the user's CONNECT with the password.
func TestEmbeddedTLSHidesPasswordsFromThePath(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, withTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "tls", false: "control-plaintext"}[withTLS], func(t *testing.T) {
			certs, err := testcerts.Make(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			extra := []string{"--auth", usersFile(t)}
			if withTLS {
				extra = append(extra, "--nats-tls-cert", certs.ServerCert, "--nats-tls-key", certs.ServerKey)
			}
			_, url, _ := embeddedFlowd(t, extra...)
			proxy := StartProxy(t, strings.TrimPrefix(url, "nats://"))
			args := []string{"--user", "otto", "--password", authPasswords["otto"]}
			if withTLS {
				args = append(args, "--tls-ca", certs.CA)
			}
			wf := filepath.Join(t.TempDir(), "one.yaml")
			if err := os.WriteFile(wf, []byte(oneStep), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, out := flowctl(proxy.URL(), append(args, "workflow", "apply", "-f", wf)...); code != 0 {
				t.Fatalf("flowctl through the proxy: exit %d: %s", code, out)
			}
			code, out := flowctl(proxy.URL(), append(args, "run", "start", "one", "--id", "through-the-proxy")...)
			if code != 0 {
				t.Fatalf("flowctl through the proxy: exit %d: %s", code, out)
			}
			seen := proxy.Recorded()
			sniffed := bytes.Contains(seen, []byte(authPasswords["otto"]))
			switch {
			case withTLS && (sniffed || bytes.Contains(seen, []byte("CONNECT")) || bytes.Contains(seen, []byte("through-the-proxy"))):
				t.Fatalf("with TLS the path saw the password, the CONNECT or the answer (%d bytes)", len(seen))
			case withTLS && len(seen) < 1000:
				t.Fatalf("the proxy saw only %d bytes: did flowctl go through it?", len(seen))
			case !withTLS && !sniffed:
				t.Fatal("control: without TLS the proxy did not see the password: the test shows nothing")
			case !withTLS:
				at := bytes.Index(seen, []byte("CONNECT"))
				t.Logf("control: the path read %s", bytes.SplitN(seen[at:], []byte("\r\n"), 2)[0])
			}
		})
	}
}

// A second flowd joins the first's embedded server over mutual TLS (--nats-url tls://...
// with the node role's password and its client certificate, the same TLS flags that
// make the first one serve TLS); a client without a certificate is refused when the
// server has a CA (--nats-tls-ca).
func TestSecondFlowdJoinsOverMutualTLS(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	certs, err := testcerts.Make(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--nats-tls-ca", certs.CA, "--nats-tls-cert", certs.ServerCert, "--nats-tls-key", certs.ServerKey}
	_, url, _ := embeddedFlowd(t, append([]string{"--auth", usersFile(t)}, tlsFlags...)...)
	tlsURL := strings.Replace(url, "nats://", "tls://", 1)
	StartFlowdEnv(t, &Cluster{URLs: []string{tlsURL}}, "node-b", []string{"FLOWD_NATS_PASSWORD=" + authPasswords["nora"]},
		"--nats-user", "nora", "--nats-tls-ca", certs.CA, "--nats-tls-cert", certs.ClientCert, "--nats-tls-key", certs.ClientKey)
	vera := []string{"--user", "vera", "--password", authPasswords["vera"], "--tls-ca", certs.CA}
	withCert := append(vera, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)
	WaitFor(t, 60*time.Second, "node-b in the cluster, over mutual TLS", func() bool {
		code, out := flowctl(tlsURL, append(withCert, "cluster", "status", "-o", "json")...)
		var st client.ClusterStatus
		return code == 0 && json.Unmarshal([]byte(out), &st) == nil && len(st.Nodes) == 2 // node-a and node-b answered
	})
	// The joined node does the work of a node: a run succeeds, whichever node runs it.
	otto := []string{"--user", "otto", "--password", authPasswords["otto"], "--tls-ca", certs.CA, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey}
	wf := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(wf, []byte(oneStep), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := flowctl(tlsURL, append(otto, "workflow", "apply", "-f", wf)...); code != 0 {
		t.Fatalf("workflow apply: exit %d: %s", code, out)
	}
	if code, out := flowctl(tlsURL, append(otto, "run", "start", "one", "--id", "over-mtls", "--wait")...); code != 0 {
		t.Fatalf("run start --wait: exit %d: %s", code, out)
	}
	// Without a client certificate: refused in the handshake (exit 3, naming the TLS flags).
	if code, out := flowctl(tlsURL, append(vera, "run", "list")...); code != 3 || !strings.Contains(out, "--tls-cert") {
		t.Fatalf("a client without a certificate: exit %d: %s", code, out)
	}
	if nc, err := nats.Connect(tlsURL, nats.RootCAs(certs.CA), nats.UserInfo("nora", authPasswords["nora"]), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a node's password without a client certificate was accepted")
	}
}

// --auth with a --nats-listen other hosts reach and no TLS is refused at start, naming
// the flags; with --nats-insecure-plaintext flowd starts, and says at start (WARN) what
// it exposes.
func TestPlaintextAuthOnAReachableListenIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	users := usersFile(t)
	for _, insecure := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "insecure-plaintext"}[insecure], func(t *testing.T) {
			port := freePorts(t, 1)[0]
			extra := []string{"--auth", users, "--nats-listen", fmt.Sprintf("0.0.0.0:%d", port)}
			if !insecure {
				dir := t.TempDir()
				logf, err := os.Create(filepath.Join(dir, "flowd.log"))
				if err != nil {
					t.Fatal(err)
				}
				p := &Proc{Name: "node-a", log: logf, args: append([]string{filepath.Join(Binaries(t), "flowd"), "--node-id", "node-a",
					"--data-dir", filepath.Join(dir, "data"), "--http", "off"}, extra...)}
				p.start(t)
				t.Cleanup(p.Kill)
				WaitFor(t, 30*time.Second, "flowd to exit", func() bool { return !p.Alive() })
				log := LogOf(p)
				if p.ExitCode() == 0 || !strings.Contains(log, "without TLS every password") ||
					!strings.Contains(log, "--nats-tls-cert and --nats-tls-key") || !strings.Contains(log, "--nats-insecure-plaintext") {
					t.Fatalf("exit %d: %s", p.ExitCode(), log)
				}
				return
			}
			p, _, _ := embeddedFlowd(t, append(extra, "--nats-insecure-plaintext")...)
			var warned bool
			for _, line := range strings.Split(LogOf(p), "\n") {
				warned = warned || (strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "takes plaintext connections") &&
					strings.Contains(line, "every password"))
			}
			if !warned {
				t.Fatalf("no WARN of plaintext at start:\n%s", LogOf(p))
			}
		})
	}
}

// A viewer cannot read an operator's answers: the server refuses her subscriptions to
// every inbox and to the operator's, and the operator's run.start answer (the run's ID)
// reaches him alone. Negative control: flowd linked with the permissions from before
// issue 24 and a client on the old inbox "_INBOX": the viewer's "_INBOX.>" reads the
// operator's answer.
func TestViewerCannotReadAnOperatorsAnswers(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "own-inboxes", true: "control-old-inboxes"}[old], func(t *testing.T) {
			if testing.Short() {
				t.Skip("starts flowd processes")
			}
			bin, opInbox := filepath.Join(Binaries(t), "flowd"), []nats.Option(nil)
			if old {
				bin, opInbox = oldInboxesFlowd(t), []nats.Option{nats.CustomInboxPrefix("_INBOX")}
			}
			_, url, _ := embeddedFlowdBin(t, bin, "--auth", usersFile(t))
			violations := make(chan error, 8)
			vera, err := nats.Connect(url, nats.UserInfo("vera", authPasswords["vera"]), nats.CustomInboxPrefix(client.InboxPrefix("vera")),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					select {
					case violations <- err:
					default:
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer vera.Close()
			eavesdrop := []string{"_INBOX.>", client.InboxPrefix("otto") + ".>"}
			if old {
				eavesdrop = eavesdrop[:1]
			}
			var subs []*nats.Subscription
			for _, subject := range eavesdrop {
				sub, err := vera.SubscribeSync(subject)
				if err != nil {
					t.Fatal(err)
				}
				subs = append(subs, sub)
			}
			if err := vera.Flush(); err != nil {
				t.Fatal(err)
			}
			if !old {
				for _, subject := range eavesdrop {
					select {
					case err := <-violations:
						if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
							t.Fatalf("subscribing to %s: %v", subject, err)
						}
					case <-time.After(10 * time.Second):
						t.Fatalf("the server did not refuse the viewer's subscription to %s", subject)
					}
				}
			}
			otto, err := client.Dial(url, client.WithNATSOptions(append(opInbox, nats.UserInfo("otto", authPasswords["otto"]))...))
			if err != nil {
				t.Fatal(err)
			}
			defer otto.Close()
			ctx := logCtx(t)
			if _, err := otto.ApplyWorkflow(ctx, "one.yaml", []byte(oneStep)); err != nil {
				t.Fatal(err)
			}
			id, err := otto.StartRun(ctx, "one", client.StartOptions{ID: "otto-payroll-7"})
			if err != nil || id != "otto-payroll-7" {
				t.Fatalf("the operator's own answer: %q %v", id, err)
			}
			// A copy for the viewer left the server before the operator's answer did: a
			// round trip of her connection brings it in.
			if err := vera.Flush(); err != nil {
				t.Fatal(err)
			}
			var read [][]byte
			for _, sub := range subs {
				for {
					m, err := sub.NextMsg(0)
					if err != nil {
						break
					}
					read = append(read, m.Data)
				}
			}
			stolen := bytes.Contains(bytes.Join(read, nil), []byte("otto-payroll-7"))
			switch {
			case !old && len(read) > 0:
				t.Fatalf("the viewer read %d of the operator's answers: %q", len(read), read)
			case old && !stolen:
				t.Fatal("control: with the old permissions the viewer did not read the operator's answer: the test shows nothing")
			case old:
				t.Logf("control: the viewer read %d answers of the operator's, one holding his run's ID", len(read))
			}
		})
	}
}

// A node's credentials cannot put words in a person's mouth: a run.cancel sent from the
// node account with a forged Nats-Request-Info naming an admin is refused by the server
// (a node may not call the API), the run goes on, and no history event names the admin.
// Negative control: flowd linked with the node role from before issue 24 (">"): the
// forged cancel is applied and the history records it as the admin's.
func TestNodeCannotSpeakForAPerson(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "node-role", true: "control-old-node-role"}[old], func(t *testing.T) {
			if testing.Short() {
				t.Skip("starts flowd processes")
			}
			bin, inbox := filepath.Join(Binaries(t), "flowd"), []nats.Option(nil)
			if old { // the node role alone as before: people keep their own inboxes
				bin = oldNodeRoleFlowd(t)
			}
			_, url, _ := embeddedFlowdBin(t, bin, "--auth", usersFile(t))
			as := func(user string) *client.Client {
				cl, err := client.Dial(url, client.WithNATSOptions(append(inbox, nats.UserInfo(user, authPasswords[user]))...))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cl.Close)
				return cl
			}
			runningRun(t, as("otto"), "victim")
			violations := make(chan error, 8)
			nora, err := nats.Connect(url, nats.UserInfo("nora", authPasswords["nora"]), nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					select {
					case violations <- err:
					default:
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer nora.Close()
			forged := nats.NewMsg(client.Subject + ".run.cancel")
			forged.Header.Set("Nats-Request-Info", `{"acc":"FLOW_USERS","rtt":1000,"user":"ann"}`)
			forged.Data = []byte(`{"v":1,"id":"victim"}`)
			ctx := logCtx(t)
			viewer := as("vera")
			if old {
				if _, err := nora.RequestMsg(forged, 30*time.Second); err != nil {
					t.Fatalf("control: the forged cancel: %v", err)
				}
			} else {
				if err := nora.PublishMsg(forged); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-violations:
					if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), client.Subject+".run.cancel") {
						t.Fatalf("the forged cancel: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the server did not refuse a node's run.cancel")
				}
			}
			// The history as it is now that the server has dealt with the forgery (a
			// request goes through the log: read after the node's state caught up).
			events, err := viewer.History(ctx, "victim")
			if err != nil {
				t.Fatal(err)
			}
			var byAnn []string
			for _, ev := range events {
				if ev.Actor == "ann" {
					byAnn = append(byAnn, ev.Kind)
				}
			}
			r, err := viewer.Run(ctx, "victim")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case !old && (len(byAnn) > 0 || r.Status != "running"):
				t.Fatalf("after the refused forgery: %s, events by ann %v", r.Status, byAnn)
			case old && len(byAnn) == 0:
				t.Fatalf("control: the forged cancel is not in the history as ann's (run %s, %+v): the test shows nothing", r.Status, events)
			case old:
				t.Logf("control: the history says ann did %v; the run is %s", byAnn, r.Status)
			}
		})
	}
}
