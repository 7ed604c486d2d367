package cli

// flowctl's credentials, TLS and exit code 4 against a real nats-server, embedded, with
// users whose permissions are the roles' (client.PermissionsOf), as an external server
// configured from `flowctl auth permissions` would have them. A node-role connection
// answers the operations in place of flowd: what is under test is what the server
// refuses and what flowctl makes of it.

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/flowrun/flow/internal/testkit/testcerts"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/testnats"
)

// authPasswords are the test server's users, one per role, named after it.
var authPasswords = map[string]string{client.RoleViewer: "viewer-pw-3141", client.RoleOperator: "operator-pw-2718", client.RoleNode: "node-pw-1618"}

// testSeed is an nkey user seed (nats-server's own tests use it); the server knows its
// public key as an operator.
const testSeed = "SUAKYRHVIOREXV7EUZTBHUHL7NUMHPMAS7QMDU3GTIUWEI5LDNOXD43IZY"

func rolePermissions(t *testing.T, role, user string) *server.Permissions {
	t.Helper()
	p, err := client.PermissionsOf(role, user)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := natsnode.ServerPermissions(p)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// natsServer starts an embedded nats-server on 127.0.0.1 as opts says (plus what every
// test needs), and a connection (made with connect, as the node user when the server
// has users) that answers every operation. It returns the client URL.
func natsServer(t *testing.T, opts *server.Options, connect ...nats.Option) string {
	t.Helper()
	url := testnats.Server(t, opts).ClientURL()
	if len(opts.Users) > 0 {
		connect = append(connect, nats.UserInfo(client.RoleNode, authPasswords[client.RoleNode]))
	}
	nc, err := nats.Connect(url, connect...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close) // before the server shuts down (cleanups run last first)
	answers := map[string]string{"run.start": `{"id":"r-1"}`, "workflow.list": `[]`}
	if _, err := nc.Subscribe(client.Subject+".>", func(m *nats.Msg) {
		_ = m.Respond([]byte(answers[strings.TrimPrefix(m.Subject, client.Subject+".")]))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the subscription is in place before any call
		t.Fatal(err)
	}
	return url
}

// authServer is a server with a user per role and an nkey user of the operator role
// (the seed in the file it returns). Anonymous connections are refused.
func authServer(t *testing.T) (url, seedFile string) {
	t.Helper()
	seedFile = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, []byte(testSeed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The seed's public key, as nats.go derives it.
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	var o nats.Options
	if err := opt(&o); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Nkeys: []*server.NkeyUser{{Nkey: o.Nkey, Permissions: rolePermissions(t, client.RoleOperator, o.Nkey)}}}
	for role, pw := range authPasswords {
		opts.Users = append(opts.Users, &server.User{Username: role, Password: pw, Permissions: rolePermissions(t, role, role)})
	}
	return natsServer(t, opts), seedFile
}

// ctl runs flowctl with the environment env (and nothing else of the process's).
func ctl(env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Run(args, &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// noPassword fails if any of the test's passwords shows in s.
func noPassword(t *testing.T, what, s string) {
	t.Helper()
	for _, pw := range append([]string{"wrong-pw-1414"}, authPasswords[client.RoleViewer], authPasswords[client.RoleOperator], authPasswords[client.RoleNode]) {
		if strings.Contains(s, pw) {
			t.Fatalf("%s shows a password: %q", what, s)
		}
	}
}

// The server refusing an operation for this user, or the connection's credentials, is
// exit code 4 with one line naming what to do; allowed operations work; the flags and
// the environment give the credentials, the flags first.
func TestNotAuthorizedIsExit4(t *testing.T) {
	url, seed := authServer(t)
	viewer := []string{"--server", url, "--user", "viewer", "--password", authPasswords[client.RoleViewer]}
	operator := []string{"--server", url, "--user", "operator", "--password", authPasswords[client.RoleOperator]}
	cases := []struct {
		what string
		env  map[string]string
		args []string
		code int
		out  string // stdout holds it
		err  string // stderr holds it
	}{
		{"a viewer starts a run", nil, append(viewer, "run", "start", "hello"), 4, "",
			"flowctl: not authorized: run.start needs the operator role (or higher); ask an admin for credentials with that role\n"},
		{"a viewer purges the DLQ", nil, append(viewer, "dlq", "purge", "r-1"), 4, "", "dlq.purge needs the admin role (or higher)"},
		{"a viewer lists workflows", nil, append(viewer, "-o", "json", "workflow", "list"), 0, "[]", ""},
		{"an operator starts a run", nil, append(operator, "run", "start", "hello"), 0, "r-1", ""},
		{"an nkey operator starts a run", nil, []string{"--server", url, "--nkey", seed, "run", "start", "hello"}, 0, "r-1", ""},
		{"a wrong password", nil, []string{"--server", url, "--user", "viewer", "--password", "wrong-pw-1414", "workflow", "list"}, 4, "",
			`refused the connection's credentials (nats: Authorization Violation); check user "viewer" (--user and --password)`},
		{"anonymous", nil, []string{"--server", url, "workflow", "list"}, 4, "",
			"the server wants credentials: give --user and --password, --creds FILE or --nkey FILE"},
		{"the environment", map[string]string{"FLOW_SERVER": url, "FLOW_USER": "operator", "FLOW_PASSWORD": authPasswords[client.RoleOperator]},
			[]string{"run", "start", "hello"}, 0, "r-1", ""},
		{"--user with FLOW_PASSWORD", map[string]string{"FLOW_PASSWORD": authPasswords[client.RoleOperator]},
			[]string{"--server", url, "--user", "operator", "run", "start", "hello"}, 0, "r-1", ""},
		{"flags over the environment's user", map[string]string{"FLOW_USER": "viewer", "FLOW_PASSWORD": "wrong-pw-1414"}, append(operator, "run", "start", "hello"), 0, "r-1", ""},
		{"flags over the environment's other kind", map[string]string{"FLOW_CREDS": "/nonexistent/user.creds", "FLOW_NKEY": seed}, append(viewer, "run", "start", "hello"), 4, "",
			"run.start needs the operator role"},
		{"a wrong password in the URL", nil, []string{"--server", strings.Replace(url, "nats://", "nats://viewer:wrong-pw-1414@", 1), "workflow", "list"}, 4, "",
			"not authorized: nats://viewer:xxxxx@127.0.0.1:"},
		{"a password in the URL of no server", nil, []string{"--server", "nats://viewer:wrong-pw-1414@127.0.0.1:1", "workflow", "list"}, 3, "",
			"flowctl: flow server unreachable: nats://viewer:xxxxx@127.0.0.1:1: "},
		{"a wrong password in the environment", map[string]string{"FLOW_USER": "viewer", "FLOW_PASSWORD": "wrong-pw-1414"},
			[]string{"--server", url, "workflow", "list"}, 4, "", `check user "viewer" (FLOW_USER and FLOW_PASSWORD)`},
	}
	for _, c := range cases {
		code, out, errOut := ctl(c.env, c.args...)
		if code != c.code || !strings.Contains(out, c.out) || !strings.Contains(errOut, c.err) || (c.code != 0 && strings.Count(errOut, "\n") != 1) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, %q on stdout, %q on stderr in one line", c.what, code, out, errOut, c.code, c.out, c.err)
		}
		noPassword(t, c.what, out+errOut)
	}
}

// Bad credentials or TLS input is bad usage (exit 2): one line naming the flag (or the
// variable) and the fix, no password, no panic, and nothing sent.
func TestConnectionFlagsBadInput(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a PEM file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	// No server listens there: a case that got past its checks would exit 3, not 2.
	const server = "nats://127.0.0.1:1"
	pw := "wrong-pw-1414"
	cases := []struct {
		what string
		env  map[string]string
		args []string
		err  string
	}{
		{"--password alone", nil, []string{"--password", pw}, "--password needs a user name: give --user (or FLOW_USER)"},
		{"FLOW_PASSWORD alone", map[string]string{"FLOW_PASSWORD": pw}, nil, "FLOW_PASSWORD needs a user name: give --user (or FLOW_USER)"},
		{"--user alone", nil, []string{"--user", "viewer"}, "--user needs a password: give --password, or FLOW_PASSWORD"},
		{"--user and --creds", nil, []string{"--user", "viewer", "--password", pw, "--creds", junk},
			"--user/--password and --creds are credentials of different kinds: give one kind only: --user and --password, --creds FILE or --nkey FILE"},
		{"--creds and --nkey", nil, []string{"--creds", junk, "--nkey", junk}, "--creds and --nkey are credentials of different kinds"},
		{"two kinds in the environment", map[string]string{"FLOW_CREDS": junk, "FLOW_NKEY": junk}, nil, "FLOW_CREDS and FLOW_NKEY are credentials of different kinds"},
		{"a missing --creds", nil, []string{"--creds", missing}, "--creds " + missing + ": nats: open " + missing},
		{"a bad --creds", nil, []string{"--creds", junk}, "--creds " + junk + ": "},
		{"a missing FLOW_CREDS", map[string]string{"FLOW_CREDS": missing}, nil, "FLOW_CREDS " + missing + ": "},
		{"a missing --nkey", nil, []string{"--nkey", missing}, "--nkey " + missing + ": "},
		{"a bad --nkey", nil, []string{"--nkey", junk}, "give a file holding an nkey user seed"},
		{"a missing --tls-ca", nil, []string{"--tls-ca", missing}, "--tls-ca " + missing + ": "},
		{"a bad FLOW_TLS_CA", map[string]string{"FLOW_TLS_CA": junk}, nil, "FLOW_TLS_CA " + junk + ": "},
		{"--tls-cert alone", nil, []string{"--tls-cert", junk}, "--tls-cert needs --tls-key: give the PEM file of the client certificate's private key"},
		{"--tls-key alone", nil, []string{"--tls-key", junk}, "--tls-key needs --tls-cert"},
		{"a bad --tls-cert", nil, []string{"--tls-cert", junk, "--tls-key", missing}, "--tls-cert " + junk + " --tls-key " + missing + ": "},
	}
	for _, c := range cases {
		code, out, errOut := ctl(c.env, append(append([]string{"--server", server}, c.args...), "workflow", "list")...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, "flowctl: ") || !strings.Contains(errOut, c.err) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", c.what, code, out, errOut, c.err)
		}
		noPassword(t, c.what, errOut)
	}
}

// --help shows no password, not even one from the environment, in FLOW_PASSWORD or in
// the URL of FLOW_SERVER.
func TestHelpShowsNoPassword(t *testing.T) {
	code, out, errOut := ctl(map[string]string{"FLOW_PASSWORD": "wrong-pw-1414", "FLOW_USER": "viewer",
		"FLOW_SERVER": "nats://viewer:wrong-pw-1414@127.0.0.1:4222"}, "--help")
	if code != 0 || !strings.Contains(out, "--password") || !strings.Contains(out, "--tls-ca") || !strings.Contains(out, `(default "nats://viewer:xxxxx@127.0.0.1:4222")`) {
		t.Fatalf("--help: %d %q %q", code, out, errOut)
	}
	noPassword(t, "--help", out+errOut)
}

// A server that wants TLS with a client certificate (verify) takes flowctl with
// --tls-ca, --tls-cert and --tls-key; without the client certificate, or without the
// CA, the TLS handshake fails: that is no permissions refusal but no server to talk
// to, exit 3, with the TLS flags to check.
func TestTLS(t *testing.T) {
	p, err := testcerts.Make(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.ServerCert, KeyFile: p.ServerKey, CaFile: p.CA, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	url := natsServer(t, &server.Options{TLS: true, TLSVerify: true, TLSConfig: tc, TLSTimeout: 5},
		nats.RootCAs(p.CA), nats.ClientCert(p.ClientCert, p.ClientKey))
	cert := []string{"--tls-cert", p.ClientCert, "--tls-key", p.ClientKey}
	cases := []struct {
		what string
		env  map[string]string
		args []string
		code int
		err  string
	}{
		{"the CA and a client certificate", nil, append([]string{"--tls-ca", p.CA}, cert...), 0, ""},
		{"FLOW_TLS_CA and a client certificate", map[string]string{"FLOW_TLS_CA": p.CA}, cert, 0, ""},
		{"no client certificate", nil, []string{"--tls-ca", p.CA}, 3, "and --tls-cert and --tls-key if the server wants a client certificate"},
		{"no CA", nil, cert, 3, "certificate signed by unknown authority"},
		{"nothing", nil, nil, 3, "check --tls-ca (or FLOW_TLS_CA)"},
	}
	for _, c := range cases {
		code, out, errOut := ctl(c.env, append(append([]string{"--server", url}, c.args...), "-o", "json", "workflow", "list")...)
		if code != c.code || !strings.Contains(errOut, c.err) || (code == 0 && strings.TrimSpace(out) != "[]") || (code != 0 && strings.Count(errOut, "\n") != 1) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d and %q", c.what, code, out, errOut, c.code, c.err)
		}
		if code == 3 && !strings.Contains(errOut, "TLS") {
			t.Errorf("%s: %q does not say TLS failed", c.what, errOut)
		}
	}
}

// auth permissions prints a user's permissions of a role as a block of the nats-server
// configuration (against golden files: go test -update), which nats-server reads back
// into exactly client.PermissionsOf; -o json is client.Permissions; an unknown role is
// bad usage, naming the roles, and a person's role without --user is bad usage too.
func TestAuthPermissions(t *testing.T) {
	for _, role := range client.Roles {
		want, err := client.PermissionsOf(role, "otto")
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"auth", "permissions", role, "--user", "otto"}
		if role == client.RoleNode {
			args = args[:3] // the same block for every node
		}
		code, out, errOut := ctl(nil, args...)
		if code != 0 || errOut != "" {
			t.Fatalf("auth permissions %s: %d %q", role, code, errOut)
		}
		golden := filepath.Join("testdata", "auth-permissions-"+role+".golden")
		if *update {
			if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		g, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test -update once)", err)
		}
		if out != string(g) {
			t.Errorf("auth permissions %s differs from %s:\n%s", role, golden, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if len(l) > 80 {
				t.Errorf("auth permissions %s: over 80 columns: %q", role, l)
			}
		}
		wantServer, err := natsnode.ServerPermissions(want)
		if err != nil {
			t.Fatal(err)
		}

		// Pasted into a user of a server's configuration, the block is the role's.
		conf := filepath.Join(t.TempDir(), "server.conf")
		if err := os.WriteFile(conf, []byte("authorization {\n  users: [\n    {user: u, password: p,\n"+out+"    }\n  ]\n}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatalf("nats-server does not read the block of %s: %v\n%s", role, err, out)
		}
		if len(opts.Users) != 1 || opts.Users[0].Permissions == nil || opts.Users[0].Permissions.Publish == nil || opts.Users[0].Permissions.Subscribe == nil {
			t.Fatalf("%s: the server read %+v", role, opts.Users)
		}
		if got := opts.Users[0].Permissions; !reflect.DeepEqual(got, wantServer) {
			t.Errorf("%s: the server read publish %+v, subscribe %+v, responses %+v; want %+v", role, got.Publish, got.Subscribe, got.Response, want)
		}

		code, out, _ = ctl(nil, append(args, "-o", "json")...)
		var asJSON client.Permissions
		if code != 0 || json.Unmarshal([]byte(out), &asJSON) != nil || !reflect.DeepEqual(asJSON, want) {
			t.Errorf("auth permissions %s -o json: %d %q; want %+v", role, code, out, want)
		}
		// And the JSON, as the value of a user's permissions (docs/security.md does so):
		// the server's configuration reads no \u escapes, so ">" must be written as is.
		conf = filepath.Join(t.TempDir(), "server-json.conf")
		if err := os.WriteFile(conf, []byte("authorization {\n  users: [\n    {user: u, password: p, permissions: "+out+"}\n  ]\n}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if opts, err = server.ProcessConfigFile(conf); err != nil || len(opts.Users) != 1 || !reflect.DeepEqual(opts.Users[0].Permissions, wantServer) {
			t.Errorf("nats-server does not read the JSON of %s: %v\n%s", role, err, out)
		}
	}
	for _, args := range [][]string{{"auth", "permissions", "root"}, {"auth", "permissions"}, {"auth", "permissions", "viewer", "admin"}} {
		code, out, errOut := ctl(nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "viewer, operator, admin, node") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d %q %q; want 2 and the roles", args, code, out, errOut)
		}
	}
	code, out, errOut := ctl(nil, "auth", "permissions", "viewer")
	if code != 2 || out != "" || !strings.Contains(errOut, "needs --user NAME") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("a person's role without --user: exit %d %q %q; want 2 asking for --user", code, out, errOut)
	}
	// A user name that is not one subject token gets an inbox that is, its own.
	code, out, _ = ctl(nil, "auth", "permissions", "viewer", "--user", "ann.smith", "-o", "json")
	if code != 0 || !strings.Contains(out, `"_INBOX_ann_2Esmith.>"`) {
		t.Errorf("ann.smith's block: exit %d %s", code, out)
	}
}
