package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// connFlags are the connection's credentials and TLS files as flags. They have no
// defaults, the environment's included, so that --help never shows a password: the
// environment (FLOW_USER, ...) is read when connecting, for what the flags left out.
type connFlags struct {
	user, password, creds, nkey string
	tlsCA, tlsCert, tlsKey      string
}

func (f *connFlags) register(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.user, "user", "", "NATS user name, with --password (env FLOW_USER)")
	fs.StringVar(&f.password, "password", "", "the --user's password (env FLOW_PASSWORD, which keeps it out of the process list)")
	fs.StringVar(&f.creds, "creds", "", "NATS credentials FILE: a user JWT and its seed (env FLOW_CREDS)")
	fs.StringVar(&f.nkey, "nkey", "", "FILE holding an nkey user seed (env FLOW_NKEY)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "PEM FILE of the CA that signed the server's certificate (env FLOW_TLS_CA)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM FILE of a client certificate, with --tls-key")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM FILE of the --tls-cert's private key")
}

// setting is a value and the flag or environment variable it came from, to name in
// errors (never the value: it may be a password).
type setting struct{ value, from string }

// connection is what flowctl connects with: the NATS options, and a description of
// the credentials for errors ("" for none).
type connection struct {
	options     []nats.Option
	credentials string
}

// connectOptions turns the flags and the environment into NATS options, and refuses
// bad input (exit 2) before anything is sent: a missing or unreadable file, half a
// pair, two kinds of credentials.
func (a *app) connectOptions() (connection, error) {
	f, env := a.conn, a.getenv
	if env == nil { // an app made in a test, with no environment
		env = func(string) string { return "" }
	}
	pick := func(flag, flagName, envName string) setting {
		if flag != "" {
			return setting{flag, flagName}
		}
		return setting{env(envName), envName}
	}
	user := pick(f.user, "--user", "FLOW_USER")
	password := pick(f.password, "--password", "FLOW_PASSWORD")
	creds := pick(f.creds, "--creds", "FLOW_CREDS")
	nkey := pick(f.nkey, "--nkey", "FLOW_NKEY")
	// Flags win over the environment: credentials given as flags set aside those of any
	// other kind in the environment (a user and password are one kind: --user with
	// FLOW_PASSWORD is how a password stays off the command line).
	if f.user != "" || f.password != "" || f.creds != "" || f.nkey != "" {
		if f.user == "" && f.password == "" {
			user, password = setting{}, setting{}
		}
		if f.creds == "" {
			creds = setting{}
		}
		if f.nkey == "" {
			nkey = setting{}
		}
	}
	var kinds []string
	if user.value != "" || password.value != "" {
		kinds = append(kinds, strings.Trim(nonEmpty(user)+"/"+nonEmpty(password), "/"))
	}
	if creds.value != "" {
		kinds = append(kinds, creds.from)
	}
	if nkey.value != "" {
		kinds = append(kinds, nkey.from)
	}
	if len(kinds) > 1 {
		list := strings.Join(kinds[:len(kinds)-1], ", ") + " and " + kinds[len(kinds)-1]
		return connection{}, usage("%s are credentials of different kinds: give one kind only: --user and --password, --creds FILE or --nkey FILE", list)
	}

	var c connection
	switch {
	case user.value != "" || password.value != "":
		if user.value == "" {
			return connection{}, usage("%s needs a user name: give --user (or FLOW_USER)", password.from)
		}
		if password.value == "" {
			return connection{}, usage("%s needs a password: give --password, or FLOW_PASSWORD to keep it out of the process list", user.from)
		}
		c.options = append(c.options, nats.UserInfo(user.value, password.value))
		c.credentials = fmt.Sprintf("user %q (%s and %s)", user.value, user.from, password.from)
	case creds.value != "":
		opt := nats.UserCredentials(creds.value)
		// nats.go reads the file only when connecting; read it now, with nats.go's own
		// parser, so that a bad file is bad input rather than a failed connection.
		var o nats.Options
		err := opt(&o)
		if err == nil {
			_, err = o.UserJWT()
		}
		if err == nil {
			_, err = o.SignatureCB([]byte("flowctl checks the seed"))
		}
		if err != nil {
			return connection{}, usage("%s %s: %v: give a NATS credentials file (a user JWT and its seed, as nsc generate creds writes it)", creds.from, creds.value, err)
		}
		c.options = append(c.options, opt)
		c.credentials = fmt.Sprintf("the credentials file %s (%s)", creds.value, creds.from)
	case nkey.value != "":
		opt, err := nats.NkeyOptionFromSeed(nkey.value)
		if err != nil {
			return connection{}, usage("%s %s: %v: give a file holding an nkey user seed (it starts with SU)", nkey.from, nkey.value, err)
		}
		c.options = append(c.options, opt)
		c.credentials = fmt.Sprintf("the nkey seed in %s (%s)", nkey.value, nkey.from)
	}

	if ca := pick(f.tlsCA, "--tls-ca", "FLOW_TLS_CA"); ca.value != "" {
		opt := nats.RootCAs(ca.value)
		if err := opt(&nats.Options{}); err != nil { // it reads the file: a bad one is bad input
			return connection{}, usage("%s %s: %v: give a PEM file of the CA certificate that signed the server's", ca.from, ca.value, err)
		}
		c.options = append(c.options, opt)
	}
	switch {
	case f.tlsCert != "" && f.tlsKey == "":
		return connection{}, usage("--tls-cert needs --tls-key: give the PEM file of the client certificate's private key")
	case f.tlsKey != "" && f.tlsCert == "":
		return connection{}, usage("--tls-key needs --tls-cert: give the PEM file of the client certificate")
	case f.tlsCert != "":
		opt := nats.ClientCert(f.tlsCert, f.tlsKey)
		if err := opt(&nats.Options{}); err != nil { // it reads both files
			return connection{}, usage("--tls-cert %s --tls-key %s: %v: give PEM files of a client certificate and its private key", f.tlsCert, f.tlsKey, err)
		}
		c.options = append(c.options, opt)
	}
	return c, nil
}

// redactURLs hides the credentials in NATS URLs (comma-separated): a password, or a
// lone user name, which nats.go sends as a token.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil && strings.Contains(p, "@"):
			parts[i] = "(a URL with credentials)"
		case err == nil && u.User != nil:
			if _, has := u.User.Password(); has {
				parts[i] = u.Redacted()
			} else {
				u.User = url.User("xxxxx")
				parts[i] = u.String()
			}
		}
	}
	return strings.Join(parts, ",")
}

func nonEmpty(s setting) string {
	if s.value == "" {
		return ""
	}
	return s.from
}

// connectError adds to a failed connect what to check, in flowctl's terms.
func connectError(err error, conn connection) error {
	switch {
	case errors.Is(err, client.ErrNotAuthorized) && conn.credentials == "":
		return fmt.Errorf("%w; the server wants credentials: give --user and --password, --creds FILE or --nkey FILE (or FLOW_USER and FLOW_PASSWORD, FLOW_CREDS, FLOW_NKEY)", err)
	case errors.Is(err, client.ErrNotAuthorized):
		return fmt.Errorf("%w; check %s", err, conn.credentials)
	case errors.Is(err, nats.ErrTLS):
		return fmt.Errorf("%w; check --tls-ca (or FLOW_TLS_CA), and --tls-cert and --tls-key if the server wants a client certificate", err)
	}
	return err
}

func (a *app) authCommand() *cobra.Command {
	auth := group("auth", "Users, roles and their NATS permissions")
	var user string
	perms := &cobra.Command{
		Use:   "permissions ROLE [--user NAME]",
		Short: "Print a role's NATS permissions, for an external server's configuration",
		Long: "Print the NATS permissions of a role (" + strings.Join(client.Roles, ", ") + ") as a block\n" +
			"of the nats-server configuration, to paste into a user of an external server:\n" +
			"  accounts { FLOW_USERS { users: [{user: U, password: P, permissions: {...}}] } }\n" +
			"A person's block (viewer, operator, admin) is that user's own: it lets them read\n" +
			"only the answers under their inbox prefix, so give --user (the user name, or an\n" +
			"nkey user's public key) and print one block per person. A node's block is the\n" +
			"same for every node. -o json prints them as JSON.",
		ValidArgs: client.Roles,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usage("auth permissions needs ROLE, one of %s", strings.Join(client.Roles, ", "))
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error { return a.permissions(args[0], user) },
	}
	perms.Flags().StringVar(&user, "user", "", "the user the block is for (a person's: their inbox prefix is in it); an nkey user's public key")
	auth.AddCommand(perms)
	return auth
}

func (a *app) permissions(role, user string) error {
	p, err := client.PermissionsOf(role, user)
	switch {
	case errors.Is(err, client.ErrUserNeeded):
		return usage("auth permissions %s needs --user NAME: a person's block lets them read only their own answers (inbox %s.>), so each person has their own", role, client.InboxPrefix("NAME"))
	case err != nil:
		return usage("auth permissions: unknown role %q: use one of %s", role, strings.Join(client.Roles, ", "))
	}
	return a.print(p, func(w io.Writer) { permissionsBlock(w, role, user, p) })
}

// permissionsBlock writes p in the nats-server configuration's syntax, one subject a
// line when there are several (a role has a score of them: the block stays within 80
// columns).
func permissionsBlock(w io.Writer, role, user string, p client.Permissions) {
	if user != "" && role != client.RoleNode {
		fmt.Fprintf(w, "# flow's %s role for %s (flowctl auth permissions %s --user %s)\n", role, user, role, user)
	} else {
		fmt.Fprintf(w, "# flow's %s role (flowctl auth permissions %s)\n", role, role)
	}
	fmt.Fprintln(w, "permissions: {")
	for _, d := range []struct {
		name string
		sp   client.SubjectPermission
	}{{"publish", p.Publish}, {"subscribe", p.Subscribe}} {
		fmt.Fprintf(w, "  %s: {\n", d.name)
		list := func(key string, subjects []string) {
			switch len(subjects) {
			case 0:
				return
			case 1:
				fmt.Fprintf(w, "    %s: [%s]\n", key, strconv.Quote(subjects[0]))
				return
			}
			fmt.Fprintf(w, "    %s: [\n", key)
			for i, s := range subjects {
				comma := ","
				if i == len(subjects)-1 {
					comma = ""
				}
				fmt.Fprintf(w, "      %s%s\n", strconv.Quote(s), comma)
			}
			fmt.Fprintln(w, "    ]")
		}
		list("allow", d.sp.Allow)
		list("deny", d.sp.Deny)
		fmt.Fprintln(w, "  }")
	}
	if r := p.Responses; r != nil {
		fmt.Fprintf(w, "  allow_responses: {max: %d, expires: %s}\n", r.Max, strconv.Quote(r.Expires))
	}
	fmt.Fprintln(w, "}")
}
