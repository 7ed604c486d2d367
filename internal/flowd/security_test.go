package flowd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// Security options that cannot work are refused at start, each naming the option and
// the fix, and never quoting a password.
func TestSecurityConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := write("user.nk", string(seed))
	good := write("good.yaml", "users:\n  - {user: ann, password: pw-secret-1, role: admin}\n  - {nkey: "+pub+", role: viewer}\n")
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--nats-listen", "0.0.0.0:4222"}, nil, "nats-listen: \"0.0.0.0:4222\" is reachable from other hosts"},
		{[]string{"--nats-listen", "10.1.2.3:4222"}, nil, "give --auth FILE"},
		{[]string{"--auth", filepath.Join(dir, "none.yaml")}, nil, "auth: open"},
		{[]string{"--auth", write("empty.yaml", "users: []\n")}, nil, "lists no users"},
		{[]string{"--auth", write("role.yaml", "users:\n  - {user: ann, password: pw-secret-1, role: root}\n")}, nil, "role \"root\": use one of viewer, operator, admin, node"},
		{[]string{"--auth", write("both.yaml", "users:\n  - {user: ann, password: pw-secret-1, nkey: "+pub+", role: admin}\n")}, nil, "not both"},
		{[]string{"--auth", write("nopw.yaml", "users:\n  - {user: ann, role: admin}\n")}, nil, "give user and password"},
		{[]string{"--auth", write("typo.yaml", "users:\n  - {user: ann, pasword: pw-secret-1, role: admin}\n")}, nil, "field pasword not found"},
		{[]string{"--auth", write("junk.yaml", "users: pw-secret-1\n")}, nil, "auth:"},
		{[]string{"--auth", good, "--nats-url", "nats://127.0.0.1:4222"}, nil, "cannot be used with --nats-url"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-user", "ann"}, nil, "--nats-user and --nats-password go together"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-user", "ann", "--nats-password", "pw-secret-1", "--nats-nkey", seedFile}, nil, "give one kind of credentials"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-creds", filepath.Join(dir, "none.creds")}, nil, "nats-creds: \"" + filepath.Join(dir, "none.creds") + "\" is not a readable file"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-nkey", good}, nil, "holds no nkey seed"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-tls-cert", seedFile}, nil, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"--nats-creds", seedFile}, nil, "is for joining a NATS server with --nats-url"},
		{[]string{"--nats-tls-ca", seedFile}, nil, "nats-tls-ca: makes the embedded server ask clients for certificates signed by this CA, which needs TLS: give --nats-tls-cert and --nats-tls-key"},
		{[]string{"--auth", good, "--nats-listen", "0.0.0.0:4222"}, nil, "nats-listen: \"0.0.0.0:4222\" is reachable from other hosts, and without TLS every password"},
		{[]string{"--auth", good, "--nats-listen", "10.1.2.3:4222"}, nil, "give --nats-tls-cert and --nats-tls-key (and --nats-tls-ca to require client certificates), or --nats-insecure-plaintext"},
		{[]string{"--nats-url", "nats://h:4222", "--nats-insecure-plaintext"}, nil, "nats-insecure-plaintext: is for the embedded server's --nats-listen"},
		{[]string{"--auth", good, "--nats-insecure-plaintext", "--nats-tls-cert", seedFile, "--nats-tls-key", seedFile}, nil, "contradicts --nats-tls-cert"},
		{[]string{"--nats-insecure-plaintext=maybe"}, nil, "nats-insecure-plaintext: \"maybe\": use true or false"},
		{[]string{"--nats-tls-cert", filepath.Join(dir, "none.pem"), "--nats-tls-key", seedFile}, nil, "is not a readable file"},
		{[]string{"--exec-env", "PGHOST,A=B"}, nil, "exec-env: \"A=B\" is not a variable name"},
		{nil, []string{"FLOWD_NATS_PASSWORD=pw-secret-1"}, "--nats-user and --nats-password go together"},
	} {
		_, err := Load(c.args, c.env)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%v) = %v; want %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "pw-secret-1") {
			t.Errorf("Load(%v) quotes a password: %v", c.args, err)
		}
	}
	// What works: auth with a non-loopback listener and TLS, or plaintext said out loud
	// (and warned of); credentials for --nats-url, --exec-env.
	c, err := Load([]string{"--auth", good, "--nats-listen", "0.0.0.0:4222", "--nats-tls-cert", seedFile, "--nats-tls-key", seedFile, "--exec-env", "PGHOST, PGUSER"}, nil)
	if err != nil || len(c.AuthUsers) != 2 || c.AuthUsers[1].NKey != pub || strings.Join(c.ExecEnv, ",") != "PGHOST,PGUSER" || c.PlaintextWarning() != "" || c.natsOptions() != nil {
		t.Fatalf("config %+v %v", c, err)
	}
	c, err = Load([]string{"--auth", good, "--nats-listen", "0.0.0.0:4222", "--nats-insecure-plaintext"}, nil)
	if err != nil || !strings.Contains(c.PlaintextWarning(), "0.0.0.0:4222 takes plaintext connections") {
		t.Fatalf("config %+v %v", c, err)
	}
	if _, err := Load([]string{"--auth", good, "--nats-listen", "127.0.0.1:4222"}, nil); err != nil {
		t.Fatalf("--auth on loopback without TLS: %v", err)
	}
	c, err = Load([]string{"--nats-url", "nats://h:4222", "--nats-nkey", seedFile, "--nats-tls-ca", seedFile}, nil)
	if err != nil || len(c.natsOptions()) != 2 {
		t.Fatalf("config %+v %v", c, err)
	}
	for _, listen := range []string{"127.0.0.1:4222", "localhost:4222", "[::1]:4222"} {
		if _, err := Load([]string{"--nats-listen", listen}, nil); err != nil {
			t.Errorf("loopback %s refused: %v", listen, err)
		}
	}
}
