package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
)

// authFile is the YAML of --auth (CONTRACT.md, "Security").
type authFile struct {
	Users []authUser `yaml:"users"`
}

type authUser struct {
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	NKey     string `yaml:"nkey"`
	Role     string `yaml:"role"`
}

// maxAuthFile bounds the --auth file read: it lists users, not data.
const maxAuthFile = 4 << 20

// loadAuthFile reads and checks --auth: every user has a role and either a user name
// and a password (plain or bcrypt) or an nkey. Errors name the file and the user, never
// a password.
func loadAuthFile(path string) ([]engine.NATSUser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%v (give the YAML file of the embedded server's users: docs/security.md)", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxAuthFile+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxAuthFile {
		return nil, fmt.Errorf("%s is over %d bytes: is it the users file?", path, maxAuthFile)
	}
	var af authFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&af); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v (want users: [{user: NAME, password: PASSWORD, role: ROLE}] or {nkey: PUBLIC_KEY, role: ROLE})", path, redactYAMLError(err))
	}
	if len(af.Users) == 0 {
		return nil, fmt.Errorf("%s lists no users: with --auth everyone else is refused, so list at least one (users: [{user: NAME, password: PASSWORD, role: admin}])", path)
	}
	users := make([]engine.NATSUser, 0, len(af.Users))
	for i, u := range af.Users {
		where := fmt.Sprintf("%s: user %d", path, i+1)
		if u.User != "" {
			where += " (" + u.User + ")"
		}
		if !slices.Contains(client.Roles, u.Role) {
			return nil, fmt.Errorf("%s: role %q: use one of %s", where, u.Role, strings.Join(client.Roles, ", "))
		}
		switch {
		case u.NKey != "" && (u.User != "" || u.Password != ""):
			return nil, fmt.Errorf("%s: give either user and password, or nkey, not both", where)
		case u.NKey == "" && (u.User == "" || u.Password == ""):
			return nil, fmt.Errorf("%s: give user and password (or nkey)", where)
		case u.User != "" && strings.ContainsAny(u.User, " \t\r\n"):
			return nil, fmt.Errorf("%s: a user name has no spaces", where)
		}
		users = append(users, engine.NATSUser{Name: u.User, Password: u.Password, NKey: u.NKey, Role: u.Role})
	}
	return users, nil
}

// redactYAMLError keeps a YAML error's place and drops the text it quotes, which may
// be a password.
func redactYAMLError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "`"); i >= 0 {
		msg = msg[:i] + "(value not shown)"
	}
	return msg
}

// natsAdminOptions are the options of the admin's connection for --nats-url
// (--nats-admin-creds, and the same TLS as natsOptions); none without it.
func (c *Config) natsAdminOptions() []nats.Option {
	if c.NATSURL == "" || c.NATSAdminCreds == "" {
		return nil
	}
	opts := []nats.Option{nats.UserCredentials(c.NATSAdminCreds)}
	if c.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSTLSCA))
	}
	if c.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(c.NATSTLSCert, c.NATSTLSKey))
	}
	return opts
}

// natsOptions are the connection options for --nats-url: credentials and TLS.
func (c *Config) natsOptions() []nats.Option {
	if c.NATSURL == "" {
		return nil // the TLS files are the embedded server's (daemon.go)
	}
	var opts []nats.Option
	switch {
	case c.NATSCreds != "":
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	case c.NATSNKey != "":
		if o, err := nats.NkeyOptionFromSeed(c.NATSNKey); err == nil {
			opts = append(opts, o)
		}
	case c.NATSUser != "":
		opts = append(opts, nats.UserInfo(c.NATSUser, c.NATSPassword))
	}
	if c.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSTLSCA))
	}
	if c.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(c.NATSTLSCert, c.NATSTLSKey))
	}
	return opts
}
