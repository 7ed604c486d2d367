package daemon

import (
	"errors"
	"fmt"
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
		{[]string{"--labels", "finance,EU"}, nil, "labels: label \"EU\" is not allowed: use 1-63 of a-z"},
		{nil, []string{"FLOWD_LABELS=finance,finance"}, "labels: label \"finance\" is given twice"},
		{[]string{"--priority-aging", "0s"}, nil, "priority-aging: \"0s\": use a positive duration"},
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
	if c, err = Load([]string{"--labels", "finance, eu"}, nil); err != nil || strings.Join(c.Labels, ",") != "eu,finance" {
		t.Fatalf("--labels: %v %v", c.Labels, err)
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
	// With --nats-url, --auth names the people (the UI's sign-in, the approvers' roles).
	if c, err = Load([]string{"--auth", good, "--nats-url", "nats://127.0.0.1:4222"}, nil); err != nil || len(c.AuthUsers) != 2 {
		t.Fatalf("--auth with --nats-url: %+v %v", c, err)
	}
	for _, listen := range []string{"127.0.0.1:4222", "localhost:4222", "[::1]:4222"} {
		if _, err := Load([]string{"--nats-listen", listen}, nil); err != nil {
			t.Errorf("loopback %s refused: %v", listen, err)
		}
	}
}

// Files that hold secrets (the users file, credentials, keys, a config file with a
// password) are refused when others than their owner may read or change them; the
// error names the file, its mode and the fix. At 0600 (or 0400) they are accepted.
func TestSecretFilesMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return p
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	users := "users:\n  - {user: ann, password: pw-secret-1, role: admin}\n"
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620} {
		for _, c := range []struct {
			flag string
			args func(file string) []string
			body string
		}{
			{"auth", func(f string) []string { return []string{"--auth", f} }, users},
			{"nats-creds", func(f string) []string { return []string{"--nats-url", "nats://h:4222", "--nats-creds", f} }, "creds"},
			{"nats-nkey", func(f string) []string { return []string{"--nats-url", "nats://h:4222", "--nats-nkey", f} }, string(seed)},
			{"nats-tls-key", func(f string) []string {
				return []string{"--nats-url", "nats://h:4222", "--nats-tls-cert", f, "--nats-tls-key", f}
			}, "key"},
			{"config", func(f string) []string { return []string{"--config", f} }, "nats-url: nats://h:4222\nnats-user: node\nnats-password: pw-secret-1\n"},
		} {
			file := write(c.flag+".file", c.body, mode)
			_, err := Load(c.args(file), []string{})
			want := fmt.Sprintf("%s: %s holds secrets and others than its owner may read or change it (mode %04o): chmod 600 %s", c.flag, file, mode, file)
			if !errors.Is(err, ErrConfig) || !strings.Contains(fmt.Sprint(err), want) {
				t.Errorf("%s at %04o: %v; want %q", c.flag, mode, err, want)
			}
			if strings.Contains(fmt.Sprint(err), "pw-secret-1") {
				t.Errorf("the error quotes a password: %v", err)
			}
			for _, ok := range []os.FileMode{0o600, 0o400} {
				if err := os.Chmod(file, ok); err != nil {
					t.Fatal(err)
				}
				if _, err := Load(c.args(file), []string{}); err != nil {
					t.Errorf("%s at %04o refused: %v", c.flag, ok, err)
				}
			}
		}
	}
	// A config file without a password holds no secret: any mode.
	if _, err := Load([]string{"--config", write("plain.yaml", "workers: 2\n", 0o644)}, []string{}); err != nil {
		t.Errorf("a config file without secrets at 0644: %v", err)
	}
}

// --exec-user names a user that exists, is not flowd's own, and that this process may
// switch to, or root for a flowd that is root (the one way back, warned at start);
// without it, a root flowd's steps run as DefaultExecUser. flowd refuses to start when
// that user owns the data dir or a secret file (the user's steps could read them).
func TestExecUserConfig(t *testing.T) {
	if _, err := Load([]string{"--exec-user", "no-such-user-flow"}, []string{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "exec-user: steps: user \"no-such-user-flow\"") {
		t.Errorf("--exec-user no-such-user-flow: %v", err)
	}
	cfg, err := Load([]string{"--exec-user", "root"}, []string{})
	if os.Geteuid() != 0 {
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "only a flowd running as root") {
			t.Errorf("--exec-user root as uid %d: %v", os.Geteuid(), err)
		}
		if cfg, err := Load(nil, []string{}); err != nil || cfg.ExecUser != nil || cfg.ExecUserDefault {
			t.Errorf("no --exec-user as a plain user: %+v %v; want flowd's own user", cfg, err)
		}
		t.Skip("the rest needs root (a process that may switch users)")
	}
	if err != nil || cfg.ExecUser != nil || !cfg.ExecAsRoot {
		t.Fatalf("--exec-user root as root: %+v %v; want steps as root, said so", cfg, err)
	}
	cfg, err = Load(nil, []string{})
	if err != nil || cfg.ExecUser == nil || !cfg.ExecUserDefault || cfg.ExecUser.UID == 0 || cfg.ExecAsRoot {
		t.Fatalf("no --exec-user as root: %+v %v; want the unprivileged %s", cfg, err, DefaultExecUser)
	}
	dir := t.TempDir()
	cfg, err = Load([]string{"--exec-user", "nobody", "--data-dir", filepath.Join(dir, "data")}, []string{})
	if err != nil || cfg.ExecUser == nil || cfg.ExecUser.Name != "nobody" {
		t.Fatalf("--exec-user nobody: %+v %v", cfg, err)
	}
	if err := os.Mkdir(cfg.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := checkExecUserReach(cfg); err != nil {
		t.Fatalf("a data dir of flowd's user: %v", err)
	}
	if err := os.Chown(cfg.DataDir, int(cfg.ExecUser.UID), int(cfg.ExecUser.GID)); err != nil {
		t.Fatal(err)
	}
	if err := checkExecUserReach(cfg); err == nil || !strings.Contains(err.Error(), "belongs to the exec user nobody") {
		t.Fatalf("a data dir of the exec user: %v", err)
	}
}
