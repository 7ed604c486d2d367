package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/app/webui"
	"github.com/flowrun/flow/internal/base/natsnode"
)

// Daemon is a running flowd.
type Daemon struct {
	cfg    *Config
	log    *slog.Logger
	engine *engine.Engine
	api    *apiserver.Server
	ui     *webui.Server
	http   *http.Server
	ln     net.Listener
	done   chan struct{}
	// flushTraces sends the spans still buffered (nil: no traces exported).
	flushTraces func(context.Context) error
}

// NewLogger is flowd's slog logger: text on a terminal, JSON otherwise (or as asked).
func NewLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" || (format == "auto" && isTerminal(w)) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Start starts the engine, applies the workflows directory and serves HTTP.
func Start(ctx context.Context, cfg *Config, logger *slog.Logger) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: logger, done: make(chan struct{})}
	stepsAtStart(logger, cfg)
	if w := cfg.PlaintextWarning(); w != "" {
		logger.Warn(w, "nats_listen", cfg.NATSListen)
	}
	metrics := newMetrics()
	ecfg := engine.Config{
		NodeID: cfg.NodeID, DataDir: cfg.DataDir, NATSURL: cfg.NATSURL, NATSListen: cfg.NATSListen,
		Workers: cfg.Workers, Registry: cfg.Registry, Logger: logger, StepObserver: metrics.observeStep, DisableScheduler: !cfg.Scheduler,
		Lease: epoch.Config{TTL: cfg.LeaseTTL, FastFail: cfg.FastFail, Counters: &epoch.Counters{}}, SnapshotEvery: cfg.SnapshotEvery, ParkAfter: cfg.ParkAfter, MaxRunTree: cfg.MaxRunTree,
		HoldClusterVersion: cfg.HoldClusterVersion,
		Retention:          cfg.Retention, StepLogLimit: cfg.StepLogLimit, NATSOptions: cfg.natsOptions(), NATSAdminOptions: cfg.natsAdminOptions(), NATSAuth: cfg.Auth != "", NATSUsers: cfg.AuthUsers,
		ExecEnv: cfg.ExecEnv, ExecUser: cfg.ExecUser, Labels: cfg.Labels, PriorityAging: cfg.PriorityAging, Now: cfg.Now,
	}
	if cfg.NATSURL == "" {
		ecfg.NATSServerTLS = engine.TLSFiles{CertFile: cfg.NATSTLSCert, KeyFile: cfg.NATSTLSKey, CAFile: cfg.NATSTLSCA}
	}
	e, err := engine.New(ecfg)
	if err != nil {
		return nil, err
	}
	if err := e.Start(ctx); err != nil {
		var le *natsnode.ListenError
		if errors.As(err, &le) {
			// Said as the HTTP port's is below: what is taken and the flag to change.
			return nil, fmt.Errorf("flowd: %w (is another flowd or NATS server running? stop it, or give --nats-listen another HOST:PORT)", err)
		}
		return nil, err
	}
	d.engine = e
	metrics.engine = e
	if d.api, err = apiserver.Serve(apiserver.Config{Node: e.API()}); err != nil {
		d.stopEngine()
		return nil, err
	}
	metrics.api = d.api
	if cfg.Workflows != "" {
		if err := d.applyDir(ctx, cfg.Workflows); err != nil {
			d.stopEngine()
			return nil, err
		}
	}
	if cfg.HTTP != "" && cfg.HTTP != "off" {
		ln, err := net.Listen("tcp", cfg.HTTP)
		if err != nil {
			d.stopEngine()
			return nil, fmt.Errorf("flowd: http: listen on %s: %w (is another flowd running? use --http HOST:PORT)", cfg.HTTP, err)
		}
		d.ln = ln
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics, metrics.stepDuration)
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", d.readyz)
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		if d.ui, err = webui.New(webui.Config{Backend: d.api, SignIn: cfg.Auth != "", Users: uiUsers(cfg.AuthUsers), Logger: logger,
			HTTPAddr: cfg.HTTP, Hosts: cfg.UIHosts, Proxies: cfg.UIProxies}); err != nil {
			_ = ln.Close()
			d.stopEngine()
			return nil, err
		}
		mux.Handle("/ui/", d.ui)
		mux.Handle("/ui", d.ui)
		limits := defaultHTTPLimits
		if cfg.httpLimits != nil {
			limits = *cfg.httpLimits
		}
		d.http = newHTTPServer(mux, limits)
		go func() { _ = d.http.Serve(ln) }()
	}
	logger.Info("flowd ready", "node", e.NodeID(), "nats", natsnode.Redact(e.ClientURL()), "http", d.HTTPAddr())
	return d, nil
}

// HTTPAddr is where /healthz, /readyz and /metrics are served ("" if off).
func (d *Daemon) HTTPAddr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

// Engine is the daemon's engine.
func (d *Daemon) Engine() *engine.Engine { return d.engine }

func (d *Daemon) applyDir(ctx context.Context, dir string) error {
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		files = append(files, m...)
	}
	sort.Strings(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("flowd: --workflows: %w", err)
		}
		w, err := d.engine.ApplyWorkflow(ctx, f, data)
		if err != nil {
			return fmt.Errorf("flowd: --workflows: %w", err)
		}
		d.log.Info("workflow applied", "workflow", w.Name, "version", w.Version, "file", f)
	}
	return nil
}

// readyz: NATS reachable, every supervised part healthy, the applier caught up with the log.
func (d *Daemon) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	problems := d.engine.Health(ctx).Problems
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(problems, "; "))
		return
	}
	fmt.Fprintln(w, "ready")
}

// Stop drains (hands running runs back, within the drain timeout) and shuts down.
func (d *Daemon) Stop() {
	if d.api != nil {
		d.api.Stop()
	}
	if d.ui != nil {
		d.ui.Close() // ends the live streams, which Shutdown would wait for
	}
	if d.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = d.http.Shutdown(ctx)
		cancel()
	}
	d.stopEngine()
	if d.flushTraces != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.flushTraces(ctx); err != nil {
			d.log.Warn("traces: the last spans were not sent", "err", err)
		}
	}
}

// uiUsers are the --auth users who sign in to the web UI: people (not nodes) with a
// password (an nkey user has no password to type).
func uiUsers(users []engine.NATSUser) []webui.User {
	var out []webui.User
	for _, u := range users {
		if u.Password != "" && u.Role != client.RoleNode {
			out = append(out, webui.User{Name: u.Name, Password: u.Password, Role: u.Role})
		}
	}
	return out
}

func (d *Daemon) stopEngine() {
	ctx, cancel := context.WithTimeout(context.Background(), max(d.cfg.DrainTime, time.Second))
	defer cancel()
	if err := d.engine.Stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		d.log.Warn("stop", "err", err)
	}
}
