package clustertest

import (
	"encoding/json"
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

// externalSecurityConf is the part of each server's configuration that docs/security.md
// shows: mutual TLS for clients, flow's account (JetStream, the nodes, the API exported
// with the requester's identity shared) and the people's account, each user with the
// permissions `flowctl auth permissions ROLE --user NAME -o json` printed (a person's block
// names their own inbox; the node's is every node's).
func externalSecurityConf(t *testing.T, certs testcerts.Files, perms map[string]string) string {
	return fmt.Sprintf(`
tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }
accounts {
  FLOW {
    jetstream: enabled
    users: [ {user: nora, password: %q, permissions: %s} ]
    exports: [ {service: "flow.v1.>", response_threshold: "24h"} ]
  }
  FLOW_USERS {
    users: [
      {user: vera, password: %q, permissions: %s}
      {user: otto, password: %q, permissions: %s}
      {user: ann, password: %q, permissions: %s}
    ]
    imports: [ {service: {account: FLOW, subject: "flow.v1.>"}, share: true} ]
  }
}
`, certs.ServerCert, certs.ServerKey, certs.CA,
		authPasswords["nora"], perms["node"], authPasswords["vera"], perms["viewer"],
		authPasswords["otto"], perms["operator"], authPasswords["ann"], perms["admin"])
}

// flowctlAs runs flowctl (in process) against url as user, over mutual TLS, and returns
// its exit code and output.
func flowctlAs(t *testing.T, url, user string, certs testcerts.Files, args ...string) (int, string) {
	t.Helper()
	return flowctl(url, append([]string{"--user", user, "--password", authPasswords[user],
		"--tls-ca", certs.CA, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey}, args...)...)
}

// A three-server NATS cluster set up as docs/security.md says (mutual TLS, flow's
// account and the people's, permissions from `flowctl auth permissions`), with two
// flowd nodes on the node role's credentials: a run an operator starts completes and
// its history names the operator; a viewer gets exit 4 for a start; the operator cannot
// publish to the log nor delete it; a client without a certificate is refused.
func TestExternalClusterWithRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS and flowd processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	certs, err := testcerts.Make(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// One block per person (their own inbox is in it), one for every node.
	perms := map[string]string{}
	for user, role := range map[string]string{"vera": "viewer", "otto": "operator", "ann": "admin", "nora": "node"} {
		code, out := flowctl("", "auth", "permissions", role, "--user", user, "-o", "json")
		if code != 0 {
			t.Fatalf("flowctl auth permissions %s --user %s: exit %d: %s", role, user, code, out)
		}
		perms[role] = strings.TrimSpace(out)
	}
	c := StartNATSWith(t, 3, externalSecurityConf(t, certs, perms))
	tlsOpts := []nats.Option{nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey)}
	waitJetStream(t, c, append(tlsOpts, nats.UserInfo("nora", authPasswords["nora"]))...)
	var nodes []*Proc
	for _, name := range []string{"node-a", "node-b"} {
		nodes = append(nodes, StartFlowd(t, c, name, "--nats-user", "nora", "--nats-password", authPasswords["nora"],
			"--nats-tls-ca", certs.CA, "--nats-tls-cert", certs.ClientCert, "--nats-tls-key", certs.ClientKey))
	}
	url := c.URLs[0]
	WaitFor(t, 60*time.Second, "two nodes and a leader", func() bool {
		code, out := flowctlAs(t, url, "vera", certs, "cluster", "status", "-o", "json")
		var st client.ClusterStatus
		return code == 0 && json.Unmarshal([]byte(out), &st) == nil && strings.HasPrefix(st.Leader, "node-") && len(st.Nodes) == 2
	})
	wf := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(wf, []byte(oneStep), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := flowctlAs(t, url, "otto", certs, "workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("operator: workflow apply: exit %d: %s", code, out)
	}
	if code, out := flowctlAs(t, url, "otto", certs, "run", "start", "one", "--id", "by-otto", "--wait"); code != 0 {
		t.Fatalf("operator: run start: exit %d: %s", code, out)
	}
	if code, out := flowctlAs(t, url, "vera", certs, "run", "history", "by-otto", "-o", "json"); code != 0 || !strings.Contains(out, `"actor": "otto"`) {
		t.Fatalf("viewer: the history does not name the operator: exit %d: %s", code, out)
	}
	if code, out := flowctlAs(t, url, "vera", certs, "run", "start", "one", "--id", "by-vera"); code != 4 || !strings.Contains(out, "operator") {
		t.Fatalf("viewer: run start: exit %d, want 4 naming the role it needs: %s", code, out)
	}
	if code, out := flowctlAs(t, url, "otto", certs, "dlq", "purge", "by-otto"); code != 4 {
		t.Fatalf("operator: dlq purge: exit %d, want 4: %s", code, out)
	}
	// The operator, with a NATS client of its own: no log, no JetStream API.
	errs := make(chan error, 4)
	nc, err := nats.Connect(url, append(tlsOpts, nats.UserInfo("otto", authPasswords["otto"]),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, subject := range []string{"flow.log", "$JS.API.STREAM.DELETE.FLOW_LOG"} {
		if err := nc.Publish(subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), "ermissions") || !strings.Contains(err.Error(), subject) {
				t.Fatalf("publish to %s: %v", subject, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the server did not refuse the operator's publish to %s", subject)
		}
	}
	for _, n := range nodes { // its debug log included
		if strings.Contains(LogOf(n), authPasswords["nora"]) {
			t.Errorf("%s's log holds its NATS password", n.Name)
		}
	}
	// Without a client certificate: refused.
	if nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.UserInfo("otto", authPasswords["otto"]), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without a certificate was accepted")
	}
}
