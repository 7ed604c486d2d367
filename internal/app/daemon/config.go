package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/webui"
	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// ErrConfig is returned (wrapped) for any configuration that cannot work.
var ErrConfig = errors.New("flowd: bad configuration")

// Config is flowd's configuration. CONTRACT.md names the flags; more are welcome.
type Config struct {
	ConfigFile string
	DataDir    string
	NodeID     string
	NATSURL    string
	NATSListen string
	HTTP       string
	Workers    int
	LeaseTTL   time.Duration
	ParkAfter  time.Duration // 0: the engine's default (3 lease TTLs)
	MaxRunTree int           // -1: no bound
	Workflows  string
	LogFormat  string // auto | text | json
	LogLevel   string // debug | info | warn | error
	FastFail   bool
	// HoldClusterVersion keeps the cluster version while this node is a member.
	HoldClusterVersion bool
	Scheduler          bool
	DrainTime          time.Duration
	// SnapshotEvery is how many log messages pass between the leader's snapshots.
	SnapshotEvery uint64
	// Retention is how long an ended run is kept.
	Retention time.Duration
	// StepLogLimit bounds what is kept of one step attempt's printed lines.
	StepLogLimit int64
	// Auth is the --auth file; AuthUsers its users (the embedded server refuses others).
	Auth      string
	AuthUsers []engine.NATSUser
	// Credentials for --nats-url.
	NATSCreds, NATSNKey, NATSUser, NATSPassword string
	// NATSAdminCreds (--nats-admin-creds), with --nats-url, is an admin's credentials
	// file: this node's admin path over flow's streams (docs/security.md, "Sealing and
	// repair"), which a node's credential may not change.
	NATSAdminCreds string
	// TLS: this node's certificate and trust anchor. With --nats-url, the client
	// certificate and the CA the servers are checked against; embedded, the server's
	// certificate on --nats-listen and the CA client certificates must chain to.
	NATSTLSCA, NATSTLSCert, NATSTLSKey string
	// NATSInsecurePlaintext lets --auth serve a non-loopback --nats-listen without TLS.
	NATSInsecurePlaintext bool
	// ExecEnv names flowd's environment variables that exec steps also get.
	ExecEnv []string
	// PriorityAging is --priority-aging: a queued run's priority rises by one per this
	// much waiting (engine.Config.PriorityAging).
	PriorityAging time.Duration
	// Labels are this node's worker labels (--labels): it takes the runs of workflows
	// whose runs_on (theirs and their steps') it has all of (workflow/labels.go).
	Labels []string
	// ExecUser, if set, is the user exec steps run as: --exec-user's, or, for a flowd
	// running as root without it, an unprivileged one (DefaultExecUser). nil: flowd's
	// own user (a flowd that is not root, or --exec-user root).
	ExecUser *steps.User
	// ExecUserDefault: ExecUser is the default of a root flowd, not --exec-user's.
	ExecUserDefault bool
	// ExecAsRoot: --exec-user root, the one way to run steps as root (warned at start).
	ExecAsRoot bool
	// UIHosts are more names the web UI answers to (--ui-host); UIProxies the reverse
	// proxies in front of it (--ui-proxy). docs/ui.md.
	UIHosts   []string
	UIProxies []netip.Prefix
	// httpLimits replaces the HTTP server's timeouts (tests; nil: defaultHTTPLimits).
	httpLimits *httpLimits
	// Registry holds the step kinds (default: the built-ins). Not a flag: programs that
	// embed flowd with step kinds of their own (examples/payout's nodes) set it.
	Registry *steps.Registry
	// Now is the clock of manual runs' {{ now }} defaults (nil: the real one). Not a
	// flag: an embedding program's tests pin it.
	Now func() time.Time
}

type option struct {
	name, def, usage string
}

// The options, in --help order. Each is a flag, FLOWD_<NAME> (dashes as underscores)
// and a key of the config file.
var options = []option{
	{"data-dir", "./flow-data", "directory for the state and the embedded NATS store"},
	{"node-id", "", "this node's name in leases and epochs (default: the host name)"},
	{"nats-url", "", "join this NATS (JetStream) server or cluster instead of embedding one"},
	{"nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server"},
	{"http", "127.0.0.1:8080", "address of /healthz, /readyz, /metrics and the web UI (/ui/)"},
	{"workers", "8", "runs this node executes at once"},
	{"lease-ttl", "10s", "run lease and leader term TTL (same on every node)"},
	{"park-after", "", "a sleep step at least this long parks its run (no lease, no worker) instead of holding a worker (default: 3 lease TTLs)"},
	{"max-run-tree", "2000", "the most runs one run's tree may hold: the run, the child workflows it starts, theirs... (a child start beyond it fails its step; 0: no bound)"},
	{"workflows", "", "directory of workflow YAML files to apply at start"},
	{"log-format", "auto", "auto (text on a terminal, JSON otherwise), text or json"},
	{"log-level", "info", "debug, info, warn or error"},
	{"fast-fail", "false", "exit the process when a lease cannot be renewed by 70% of its TTL"},
	{"scheduler", "true", "take part in leader elections (false: this node only runs steps)"},
	{"drain-timeout", "30s", "how long SIGTERM waits for running runs to be handed back"},
	{"retention", "720h", "how long a run that ended (succeeded, failed, cancelled) is kept before every node removes it"},
	{"step-log-limit", "1MiB", "the most of one step attempt's printed lines kept for run logs (bytes, or with KiB or MiB; past it a marker says the rest was not kept)"},
	{"snapshot-every", "100000", "log messages between the leader's snapshots of the state (the log is compacted below them)"},
	{"auth", "", "YAML file of the embedded server's users and roles (docs/security.md); without it, the server listens on loopback only"},
	{"nats-creds", "", "credentials file (JWT and seed) for --nats-url"},
	{"nats-admin-creds", "", "credentials file of an admin of flow's NATS account, for --nats-url: lets this node repair and reconfigure flow's streams (cluster repair, a changed --lease-ttl); give it once, then restart without (docs/security.md, Sealing and repair)"},
	{"nats-nkey", "", "nkey seed file for --nats-url"},
	{"nats-user", "", "user name for --nats-url (with --nats-password)"},
	{"nats-password", "", "password for --nats-user (prefer FLOWD_NATS_PASSWORD or the config file: a flag shows in ps)"},
	{"nats-tls-ca", "", "CA certificate file: with --nats-url, to check the servers against; embedded, clients must show a certificate it signed (mutual TLS)"},
	{"nats-tls-cert", "", "certificate file (with --nats-tls-key): with --nats-url, this node's client certificate; embedded, the server's, for TLS on --nats-listen"},
	{"nats-tls-key", "", "key file of --nats-tls-cert"},
	{"nats-insecure-plaintext", "false", "let --auth serve a --nats-listen other hosts reach without TLS: passwords and answers cross the network in the clear (warned at every start)"},
	{"exec-env", "", "comma-separated names of flowd's environment variables exec steps also get (by default they get only PATH, HOME, LANG, TZ, FLOW_* and their own env)"},
	{"exec-user", "", "run exec steps as this user (name or uid), who cannot read flowd's data dir, users file or credentials; flowd must be root or hold CAP_SETUID and CAP_SETGID. Default: flowd's own user, but as root the unprivileged " + DefaultExecUser + " (uid 65534 if there is none); root runs them as root, with a warning at every start (docs/security.md)"},
	{"priority-aging", "10m", "a queued run's priority rises by one for each this much it waits, when this node leads: a run waits behind runs of a priority d higher submitted after it for at most d times this (docs/workflow-spec.md, Priorities)"},
	{"labels", "", "comma-separated worker labels of this node (finance,eu): only nodes with every label a workflow's or its steps' runs_on names run its runs; a run no live node can take waits (docs/workflow-spec.md, runs_on)"},
	{"ui-host", "", "comma-separated names (or IP addresses) the web UI also answers to, besides loopback and the --http address; other names get 421 (docs/ui.md)"},
	{"hold-cluster-version", "false", "keep the cluster version (the log format writers use) where it is while this node is a member, while an upgrade is tried (docs/operations.md, Upgrading)"},
	{"ui-proxy", "", "comma-separated addresses (or CIDR prefixes) of reverse proxies in front of the web UI: their X-Forwarded-Proto and X-Forwarded-For are believed (docs/ui.md)"},
}

// Flags returns flowd's flag set (with --config).
func Flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("flowd", pflag.ContinueOnError)
	fs.String("config", "", "YAML config file (flags win over FLOWD_* variables, which win over the file)")
	for _, o := range options {
		fs.String(o.name, o.def, o.usage)
	}
	// A switch: given alone it is on (--nats-insecure-plaintext=false turns it off).
	fs.Lookup("nats-insecure-plaintext").NoOptDefVal = "true"
	fs.Lookup("hold-cluster-version").NoOptDefVal = "true"
	fs.SortFlags = false
	return fs
}

// Load parses args, the environment (FLOWD_*) and the config file, in that order of
// precedence, and validates every value. env is os.Environ-shaped (nil: os.Environ()).
func Load(args []string, env []string) (*Config, error) {
	fs := Flags()
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %w (see flowd --help)", ErrConfig, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q: flowd takes only flags (see flowd --help)", ErrConfig, fs.Arg(0))
	}
	if env == nil {
		env = os.Environ()
	}
	v := viper.New()
	for _, o := range options {
		v.SetDefault(o.name, o.def)
		if f := fs.Lookup(o.name); f.Changed {
			v.Set(o.name, f.Value.String()) // an explicit flag wins
		}
	}
	envVals := map[string]string{}
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "FLOWD_") {
			envVals[k] = val
		}
	}
	var unknownEnv []string
	for k := range envVals {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "FLOWD_"), "_", "-"))
		if name != "config" && !slices.ContainsFunc(options, func(o option) bool { return o.name == name }) {
			unknownEnv = append(unknownEnv, k)
		}
	}
	if len(unknownEnv) > 0 {
		sort.Strings(unknownEnv)
		return nil, fmt.Errorf("%w: unknown environment variable %s (known: %s)", ErrConfig, strings.Join(unknownEnv, ", "), envNames())
	}
	cfgFile, _ := fs.GetString("config")
	if !fs.Lookup("config").Changed {
		if e, ok := envVals["FLOWD_CONFIG"]; ok {
			cfgFile = e
		}
	}
	fileVals := map[string]any{}
	if cfgFile != "" {
		fv := viper.New()
		fv.SetConfigFile(cfgFile)
		fv.SetConfigType("yaml")
		if err := fv.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("%w: config file %s: %v", ErrConfig, cfgFile, err)
		}
		for _, k := range fv.AllKeys() {
			if !slices.ContainsFunc(options, func(o option) bool { return o.name == k }) {
				return nil, fmt.Errorf("%w: config file %s: unknown key %q (known: %s)", ErrConfig, cfgFile, k, flagNames())
			}
			fileVals[k] = fv.Get(k)
		}
	}
	get := func(name string) string {
		if f := fs.Lookup(name); f.Changed {
			return f.Value.String()
		}
		if e, ok := envVals["FLOWD_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]; ok {
			return e
		}
		if fvv, ok := fileVals[name]; ok {
			if list, ok := fvv.([]any); ok { // a YAML list, for the comma-separated options
				var items []string
				for _, it := range list {
					items = append(items, fmt.Sprint(it))
				}
				return strings.Join(items, ",")
			}
			return fmt.Sprint(fvv)
		}
		return v.GetString(name)
	}
	c := &Config{ConfigFile: cfgFile}
	var errs []string
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	c.DataDir = get("data-dir")
	if c.DataDir == "" {
		bad("data-dir", "must not be empty")
	}
	c.NodeID = get("node-id")
	if c.NodeID != "" && !ident.ValidID(c.NodeID) {
		bad("node-id", "%q: %s", c.NodeID, ident.IDRule)
	}
	c.NATSURL = get("nats-url")
	if c.NATSURL != "" && !strings.Contains(c.NATSURL, "://") {
		bad("nats-url", "%q: use nats://HOST:PORT (several separated by commas)", c.NATSURL)
	}
	c.NATSListen = get("nats-listen")
	if c.NATSURL != "" && fs.Lookup("nats-listen").Changed {
		bad("nats-listen", "cannot be used with --nats-url: flowd either embeds NATS or joins one")
	}
	if c.NATSURL == "" {
		checkAddr(bad, "nats-listen", c.NATSListen)
	}
	c.HTTP = get("http")
	if c.HTTP != "" && c.HTTP != "off" {
		checkAddr(bad, "http", c.HTTP)
	}
	if _, err := fmt.Sscan(get("workers"), &c.Workers); err != nil || c.Workers < 1 || c.Workers > 10000 {
		bad("workers", "%q: use a whole number from 1 to 10000", get("workers"))
	}
	if d, err := time.ParseDuration(get("retention")); err != nil || d <= 0 {
		bad("retention", "%q: use a positive duration, such as 720h (30 days) or 1m", get("retention"))
	} else {
		c.Retention = d
	}
	if n, ok := parseBytes(get("step-log-limit")); !ok || n < 1<<10 || n > 256<<20 {
		bad("step-log-limit", "%q: use a size from 1KiB to 256MiB, such as 1MiB, 512KiB or 65536 (bytes)", get("step-log-limit"))
	} else {
		c.StepLogLimit = n
	}
	if n, err := strconv.ParseUint(get("snapshot-every"), 10, 64); err != nil || n < 100 || n > 1_000_000_000 {
		bad("snapshot-every", "%q: use a whole number of log messages from 100 to 1000000000, such as 100000", get("snapshot-every"))
	} else {
		c.SnapshotEvery = n
	}
	if d, err := time.ParseDuration(get("lease-ttl")); err != nil || d < time.Second {
		bad("lease-ttl", "%q: use a duration of at least 1s, such as 10s (shorter leases expire on GC pauses)", get("lease-ttl"))
	} else {
		c.LeaseTTL = d
	}
	if v := get("park-after"); v != "" {
		if d, err := time.ParseDuration(v); err != nil || d < time.Second {
			bad("park-after", "%q: use a duration of at least 1s, such as 30s (shorter sleeps hold their worker anyway)", v)
		} else {
			c.ParkAfter = d
		}
	}
	if n, err := strconv.Atoi(get("max-run-tree")); err != nil || n < 0 || n == 1 || n > 1_000_000 {
		bad("max-run-tree", "%q: use a whole number of runs from 2 to 1000000, such as 2000 (0: no bound)", get("max-run-tree"))
	} else if c.MaxRunTree = n; n == 0 {
		c.MaxRunTree = -1
	}
	c.Workflows = get("workflows")
	if c.Workflows != "" {
		if st, err := os.Stat(c.Workflows); err != nil || !st.IsDir() {
			bad("workflows", "%q is not a directory", c.Workflows)
		}
	}
	c.LogFormat = get("log-format")
	if !slices.Contains([]string{"auto", "text", "json"}, c.LogFormat) {
		bad("log-format", "%q: use auto, text or json", c.LogFormat)
	}
	c.LogLevel = get("log-level")
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		bad("log-level", "%q: use debug, info, warn or error", c.LogLevel)
	}
	switch get("fast-fail") {
	case "true", "1", "yes":
		c.FastFail = true
	case "false", "0", "no", "":
	default:
		bad("fast-fail", "%q: use true or false", get("fast-fail"))
	}
	switch get("hold-cluster-version") {
	case "true", "1", "yes":
		c.HoldClusterVersion = true
	case "false", "0", "no", "":
	default:
		bad("hold-cluster-version", "%q: use true or false", get("hold-cluster-version"))
	}
	switch get("scheduler") {
	case "true", "1", "yes", "":
		c.Scheduler = true
	case "false", "0", "no":
	default:
		bad("scheduler", "%q: use true or false", get("scheduler"))
	}
	if d, err := time.ParseDuration(get("drain-timeout")); err != nil || d < 0 {
		bad("drain-timeout", "%q: use a duration such as 30s", get("drain-timeout"))
	} else {
		c.DrainTime = d
	}
	if d, err := time.ParseDuration(get("priority-aging")); err != nil || d <= 0 {
		bad("priority-aging", "%q: use a positive duration such as 10m (a queued run's priority rises by one per this much waiting)", get("priority-aging"))
	} else {
		c.PriorityAging = d
	}
	c.loadSecurity(get, bad)
	var err error
	if c.UIHosts, err = webui.ParseHosts(get("ui-host")); err != nil {
		bad("ui-host", "%v", err)
	}
	if c.UIProxies, err = webui.ParseProxies(get("ui-proxy")); err != nil {
		bad("ui-proxy", "%v", err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrConfig, strings.Join(errs, "; "))
	}
	return c, nil
}

// loadSecurity reads and checks the security options: --auth and the listen address,
// credentials and TLS for --nats-url, --exec-env.
func (c *Config) loadSecurity(get func(string) string, bad func(string, string, ...any)) {
	c.Auth = get("auth")
	if c.Auth != "" {
		// With --nats-url the external server has users of its own (flowctl auth
		// permissions ROLE prints a role's permissions for its configuration): the file
		// then names the people, for the web UI's sign-in and the approvers' roles, and
		// their names and passwords must be the server's (docs/security.md).
		if users, err := loadAuthFile(c.Auth); err != nil {
			bad("auth", "%v", err)
		} else {
			c.AuthUsers = users
		}
	} else if c.NATSURL == "" && c.NATSListen != "" && !natsnode.IsLoopback(c.NATSListen) {
		bad("nats-listen", "%q is reachable from other hosts, and without --auth anyone there could write to the log: give --auth FILE (docs/security.md) or listen on 127.0.0.1", c.NATSListen)
	}
	c.NATSCreds, c.NATSNKey = get("nats-creds"), get("nats-nkey")
	c.NATSAdminCreds = get("nats-admin-creds")
	c.NATSUser, c.NATSPassword = get("nats-user"), get("nats-password")
	c.NATSTLSCA, c.NATSTLSCert, c.NATSTLSKey = get("nats-tls-ca"), get("nats-tls-cert"), get("nats-tls-key")
	c.loadPlaintext(get, bad)
	kinds := 0
	for _, set := range []bool{c.NATSCreds != "", c.NATSNKey != "", c.NATSUser != "" || c.NATSPassword != ""} {
		if set {
			kinds++
		}
	}
	if kinds > 1 {
		bad("nats-creds", "give one kind of credentials: --nats-creds, --nats-nkey, or --nats-user with --nats-password")
	}
	if (c.NATSUser == "") != (c.NATSPassword == "") {
		bad("nats-user", "--nats-user and --nats-password go together")
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		bad("nats-tls-cert", "--nats-tls-cert and --nats-tls-key go together")
	}
	for _, f := range []struct {
		name, path string
		embedded   bool // also means something to the embedded server
	}{{"nats-creds", c.NATSCreds, false}, {"nats-nkey", c.NATSNKey, false}, {"nats-admin-creds", c.NATSAdminCreds, false},
		{"nats-tls-ca", c.NATSTLSCA, true}, {"nats-tls-cert", c.NATSTLSCert, true}, {"nats-tls-key", c.NATSTLSKey, true}} {
		if f.path == "" {
			continue
		}
		if c.NATSURL == "" && !f.embedded {
			bad(f.name, "is for joining a NATS server with --nats-url; the embedded server needs none for flowd itself")
		} else if st, err := os.Stat(f.path); err != nil || st.IsDir() {
			bad(f.name, "%q is not a readable file", f.path)
		}
	}
	if c.NATSURL == "" && c.NATSTLSCA != "" && c.NATSTLSCert == "" {
		bad("nats-tls-ca", "makes the embedded server ask clients for certificates signed by this CA, which needs TLS: give --nats-tls-cert and --nats-tls-key (the server's certificate) too")
	}
	if c.NATSUser != "" && c.NATSURL == "" {
		bad("nats-user", "is for joining a NATS server with --nats-url")
	}
	if c.NATSNKey != "" && c.NATSURL != "" {
		if _, err := nats.NkeyOptionFromSeed(c.NATSNKey); err != nil {
			bad("nats-nkey", "%q holds no nkey seed: %v", c.NATSNKey, err)
		}
	}
	for _, name := range strings.Split(get("exec-env"), ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if strings.ContainsAny(name, "= \t") {
			bad("exec-env", "%q is not a variable name: give names only, comma-separated (PGHOST,PGUSER)", name)
			continue
		}
		c.ExecEnv = append(c.ExecEnv, name)
	}
	c.loadExecUser(get("exec-user"), bad)
	if labels, err := workflow.ParseLabels(get("labels")); err != nil {
		bad("labels", "%v", err)
	} else {
		c.Labels = labels
	}
	c.checkSecretFiles(bad)
}

// loadPlaintext refuses --auth on a non-loopback --nats-listen without TLS, unless
// --nats-insecure-plaintext accepts it: passwords (a node's is full control of the log)
// and every answer would cross the network in the clear.
func (c *Config) loadPlaintext(get func(string) string, bad func(string, string, ...any)) {
	switch get("nats-insecure-plaintext") {
	case "true", "1", "yes":
		c.NATSInsecurePlaintext = true
	case "false", "0", "no", "":
	default:
		bad("nats-insecure-plaintext", "%q: use true or false", get("nats-insecure-plaintext"))
	}
	switch {
	case c.NATSInsecurePlaintext && c.NATSURL != "":
		bad("nats-insecure-plaintext", "is for the embedded server's --nats-listen; with --nats-url, the servers' configuration decides TLS")
	case c.NATSInsecurePlaintext && c.NATSTLSCert != "":
		bad("nats-insecure-plaintext", "contradicts --nats-tls-cert: the embedded server serves TLS; drop one of them")
	case c.NATSURL == "" && c.Auth != "" && c.NATSTLSCert == "" && !c.NATSInsecurePlaintext && !natsnode.IsLoopback(c.NATSListen):
		bad("nats-listen", "%q is reachable from other hosts, and without TLS every password (a node's is full control of the log) and every answer crosses the network in the clear: "+
			"give --nats-tls-cert and --nats-tls-key (and --nats-tls-ca to require client certificates), or --nats-insecure-plaintext to accept that (docs/security.md)", c.NATSListen)
	}
}

// PlaintextWarning is what flowd logs at every start with --nats-insecure-plaintext
// ("" without): what the embedded server then exposes.
func (c *Config) PlaintextWarning() string {
	if !c.NATSInsecurePlaintext {
		return ""
	}
	return "--nats-insecure-plaintext: the embedded NATS server on " + c.NATSListen + " takes plaintext connections: " +
		"anyone on the network path reads every password (a node's is full control of the log) and every answer, and can change them; " +
		"give --nats-tls-cert and --nats-tls-key instead (docs/security.md)"
}

func checkAddr(bad func(string, string, ...any), name, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		bad(name, "%q: use HOST:PORT such as 127.0.0.1:8080", addr)
		return
	}
	_ = host
	var p int
	if _, err := fmt.Sscan(port, &p); err != nil || p < 0 || p > 65535 {
		bad(name, "%q: the port must be a number from 0 to 65535", addr)
	}
}

func flagNames() string {
	var out []string
	for _, o := range options {
		out = append(out, o.name)
	}
	return strings.Join(out, ", ")
}

func envNames() string {
	var out []string
	for _, o := range options {
		out = append(out, "FLOWD_"+strings.ToUpper(strings.ReplaceAll(o.name, "-", "_")))
	}
	return strings.Join(out, ", ")
}

// parseBytes reads a size: a whole number of bytes, or one of KiB or MiB.
func parseBytes(s string) (int64, bool) {
	unit := int64(1)
	for suffix, u := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20} {
		if strings.HasSuffix(s, suffix) {
			s, unit = strings.TrimSuffix(s, suffix), u
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > (1<<40)/unit {
		return 0, false
	}
	return n * unit, true
}
