package natsnode

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrInvalidConfig is returned (wrapped) for a Config that cannot work.
var ErrInvalidConfig = errors.New("natsnode: invalid config")

// Defaults for Config fields left at their zero value.
const (
	DefaultMaxStore   int64 = 8 << 30  // 8 GiB of JetStream file storage
	DefaultMaxMemory  int64 = 64 << 20 // 64 MiB of JetStream memory storage (flow uses none)
	DefaultMaxPayload int32 = 8 << 20  // 8 MiB: room for a batch of 1 MiB step outputs
	readyTimeout            = 10 * time.Second
	// readyPoll: how long one look at the server's readiness lasts, between looks at
	// whether it failed to listen (the server says so only in its log, and would
	// otherwise be waited for the whole readyTimeout).
	readyPoll = 50 * time.Millisecond
)

// ListenError: the embedded server could not listen on Addr (a port another process
// holds, an address not of this host, a privileged port). errors.Is(err,
// syscall.EADDRINUSE) tells a port in use. Start returns it as soon as the server says
// so, not after waiting for it to be ready.
type ListenError struct {
	Addr string // host:port
	Err  error  // net.Listen's
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("natsnode: embedded NATS cannot listen on %s: %v", e.Addr, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// Config of an embedded server.
type Config struct {
	// DataDir holds the JetStream store (DataDir/jetstream). Required.
	DataDir string
	// Listen is the client address, e.g. "127.0.0.1:4222". Empty means in-process only
	// (no TCP listener): fast and isolated, for tests. A cluster needs a listener.
	Listen string
	// ServerName names the server in a cluster; defaults to "flow-" + the listen port
	// or "flow-embedded".
	ServerName string
	// NoSync turns off fsync of every write. Acknowledged entries can then be lost on a
	// power cut; only benchmarks of the floor and throwaway tests should set it.
	NoSync bool
	// MaxStore and MaxMemory bound JetStream storage (the server's defaults are huge).
	MaxStore, MaxMemory int64
	// MaxPayload is the largest message the server accepts.
	MaxPayload int32
	// Cluster, when Listen is set and Cluster.Listen is not empty, makes this server one
	// of a JetStream cluster.
	Cluster ClusterConfig
	// Logger receives the server's notices and errors; nil discards them.
	Logger *slog.Logger
	// Auth, when true, makes the server refuse every connection but Users' and this
	// process's own (Connect), each with its role's permissions (auth.go).
	Auth  bool
	Users []User
	// TLS, when its CertFile is set, serves TLS on the client port (Listen) and refuses
	// plaintext; its CAFile makes the server verify client certificates against that CA
	// (mutual TLS). This process's own connection is in process and needs neither.
	TLS TLSFiles
}

// TLSFiles are PEM files: a certificate and its key, and a CA.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// ClusterConfig joins an embedded server to others.
type ClusterConfig struct {
	Name   string   // cluster name, the same on every server
	Listen string   // route address, e.g. "127.0.0.1:6222"
	Routes []string // other servers' route URLs, e.g. "nats://127.0.0.1:6223"
}

// Server is a running embedded NATS server.
type Server struct {
	srv *server.Server
	// internalUser and internalPassword are this process's own credentials when the
	// server has auth: made at start, kept in memory only.
	internalUser, internalPassword string
}

// Start starts an embedded server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	opts, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	s := &Server{}
	if cfg.Auth {
		if s.internalUser, s.internalPassword, err = cfg.authOptions(opts); err != nil {
			return nil, err
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsnode: start embedded NATS: %w", err)
	}
	s.srv = srv
	if cfg.Auth {
		if err := linkAccounts(srv); err != nil {
			return nil, err
		}
	}
	// The server reports a listener it cannot open only as a fatal line of its log, and
	// carries on without it: the adapter hands that error to the wait below, which would
	// otherwise wait out readyTimeout (issue 38: a taken port cost 10 s).
	fatal := make(chan error, 1)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv.SetLoggerV2(slogAdapter{l: logger, fatal: fatal}, false, false, false)
	go srv.Start() // Start returns quickly; the server owns its goroutines until Shutdown.
	deadline := time.Now().Add(readyTimeout)
	for !srv.ReadyForConnections(readyPoll) {
		var err error
		select {
		case err = <-fatal:
		default:
			if time.Now().After(deadline) {
				err = fmt.Errorf("natsnode: embedded NATS not ready within %s (is %q in use?)", readyTimeout, cfg.Listen)
			}
		}
		if err != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, err
		}
	}
	if cfg.Auth {
		// With a second account the server no longer enables JetStream for its global
		// one (flow's: the streams are there, with or without auth) by itself; enabling
		// it here restores the streams it holds on disk.
		if err := srv.GlobalAccount().EnableJetStream(nil, nil); err != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, fmt.Errorf("natsnode: enable JetStream for flow's account: %w", err)
		}
	}
	return s, nil
}

func (cfg Config) serverOptions() (*server.Options, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%w: DataDir is empty: give the directory for JetStream files", ErrInvalidConfig)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("natsnode: data dir: %w", err)
	}
	opts := &server.Options{
		ServerName:         cfg.ServerName,
		JetStream:          true,
		StoreDir:           filepath.Join(cfg.DataDir, "jetstream"),
		SyncAlways:         !cfg.NoSync,
		JetStreamMaxStore:  orDefault(cfg.MaxStore, DefaultMaxStore),
		JetStreamMaxMemory: orDefault(cfg.MaxMemory, DefaultMaxMemory),
		MaxPayload:         orDefault(cfg.MaxPayload, DefaultMaxPayload),
		NoSigs:             true, // flowd owns the process's signals
		NoLog:              cfg.Logger == nil,
	}
	if cfg.Listen == "" {
		opts.DontListen = true
		if opts.ServerName == "" {
			opts.ServerName = "flow-embedded"
		}
	} else {
		host, port, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("%w: Listen %q: %v (want HOST:PORT such as 127.0.0.1:4222)", ErrInvalidConfig, cfg.Listen, err)
		}
		opts.Host, opts.Port = host, port
		if port == 0 {
			opts.Port = server.RANDOM_PORT // ":0" means any free port, as with net.Listen
		}
		if opts.ServerName == "" {
			opts.ServerName = "flow-" + strconv.Itoa(port)
		}
	}
	if cfg.TLS != (TLSFiles{}) {
		if err := cfg.tlsOptions(opts); err != nil {
			return nil, err
		}
	}
	if cfg.Cluster.Listen != "" {
		if cfg.Listen == "" {
			return nil, fmt.Errorf("%w: a cluster needs a client listener: set Listen (a cluster never forms without one)", ErrInvalidConfig)
		}
		host, port, err := splitHostPort(cfg.Cluster.Listen)
		if err != nil {
			return nil, fmt.Errorf("%w: Cluster.Listen %q: %v", ErrInvalidConfig, cfg.Cluster.Listen, err)
		}
		opts.Cluster.Name = cfg.Cluster.Name
		if opts.Cluster.Name == "" {
			opts.Cluster.Name = "flow"
		}
		opts.Cluster.Host, opts.Cluster.Port = host, port
		if port == 0 {
			opts.Cluster.Port = server.RANDOM_PORT
		}
		for _, r := range cfg.Cluster.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("%w: route %q: %v", ErrInvalidConfig, r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	return opts, nil
}

// tlsOptions serves TLS on the client port, verifying clients' certificates when a CA
// is given. The files are read here: a bad one stops the start with its name.
func (cfg Config) tlsOptions(opts *server.Options) error {
	t := cfg.TLS
	switch {
	case cfg.Listen == "":
		return fmt.Errorf("%w: TLS needs a client listener (Listen): in process there is nothing to encrypt", ErrInvalidConfig)
	case t.CertFile == "" || t.KeyFile == "":
		return fmt.Errorf("%w: TLS needs a certificate and its key (a CA alone verifies clients of a server that has its own certificate)", ErrInvalidConfig)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.CAFile != ""})
	if err != nil {
		return fmt.Errorf("%w: TLS: %v", ErrInvalidConfig, err)
	}
	opts.TLSConfig = tc
	opts.TLSVerify = t.CAFile != ""
	return nil
}

func splitHostPort(s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number from 0 to 65535", p)
	}
	return host, port, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Connect opens a client connection to the embedded server, in process (no TCP).
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(s.srv), nats.MaxReconnects(-1)}, opts...)
	if s.internalUser != "" {
		opts = append(opts, nats.UserInfo(s.internalUser, s.internalPassword))
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("natsnode: connect in process: %w", err)
	}
	return nc, nil
}

// ClientURL is the TCP URL of the server, or "" when it does not listen.
func (s *Server) ClientURL() string {
	if s.srv.Addr() == nil {
		return ""
	}
	return s.srv.ClientURL()
}

// Shutdown stops the server and waits for it, flushing the store. Safe to call twice.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Connect dials an external NATS server or cluster (a comma-separated URL list).
func Connect(urls, name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsnode: connect to %s: %w (is NATS running there with JetStream enabled?)", Redact(urls), err)
	}
	return nc, nil
}

// Redact is urls (comma-separated) without their user information (user:password@),
// for logs and errors: a password in --nats-url must not reach them.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			if at := strings.LastIndex(p, "@"); at >= 0 { // unparsable: cut what may be userinfo
				parts[i] = "(redacted)@" + p[at+1:]
			}
			continue
		}
		if u.User != nil {
			u.User = nil
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// slogAdapter is the server's logger: its lines into l, and its fatal ones (a listener
// it could not open) also into fatal, for Start, which keeps the first.
type slogAdapter struct {
	l     *slog.Logger
	fatal chan<- error
}

// Notices are debug: the server narrates its start and stop at length.
func (a slogAdapter) Noticef(f string, v ...any) {
	a.l.Debug(fmt.Sprintf(f, v...), "component", "nats")
}
func (a slogAdapter) Warnf(f string, v ...any) { a.l.Warn(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Fatalf(f string, v ...any) {
	a.l.Error(fmt.Sprintf(f, v...), "component", "nats")
	if le := listenError(f, v); le != nil && a.fatal != nil {
		select {
		case a.fatal <- le:
		default:
		}
	}
}

// listenError is the *ListenError of a fatal line of the server's log about a listener
// it could not open (the client port's, "Error listening on port: HOST:PORT, ERR", and
// the routes'), whose arguments carry net.Listen's error itself; nil for other lines
// (those are logged only, as before: the start goes on as the server does).
func listenError(f string, v []any) error {
	var cause error
	for _, x := range v {
		if err, ok := x.(error); ok {
			cause = err
		}
	}
	var op *net.OpError
	if strings.Contains(strings.ToLower(f), "listen") && errors.As(cause, &op) && op.Addr != nil {
		return &ListenError{Addr: op.Addr.String(), Err: cause}
	}
	return nil
}
func (a slogAdapter) Errorf(f string, v ...any) { a.l.Error(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Debugf(f string, v ...any) { a.l.Debug(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Tracef(string, ...any)     {}
