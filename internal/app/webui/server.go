package webui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/base/audit"
)

// Backend is what the UI reads and asks of the node: the API's operations in process
// (the same answers flowctl gets) and a few reads of its own.
type Backend interface {
	Do(ctx context.Context, op string, req client.Request) (any, error)
	RunsPage(ctx context.Context, opts client.ListOptions) (client.RunPage, error)
	RunsWithIDPrefix(ctx context.Context, prefix string, limit int) ([]client.Run, error)
	StepNeeds(workflow string, version int) ([]apiserver.StepNeeds, error)
	Versions(workflow string) ([]client.Workflow, error)
	Ticks(workflow string, n int) ([]client.Tick, error)
	Changed() <-chan struct{}
	// AppliedRun is run.get's answer from the node's state as it stands, without
	// catching up with the log: the live streams' one reader of a run, woken by Changed.
	AppliedRun(id string) (client.Run, error)
}

// User may sign in to the UI (flowd --auth's users with a password).
type User struct {
	Name     string
	Password string // plain, or bcrypt ("$2...")
	Role     string // client.Roles
}

// peopleRoles are the roles that sign in to the UI: a node's credentials are for flowd.
var peopleRoles = []string{client.RoleViewer, client.RoleOperator, client.RoleAdmin}

// Config of a Server.
type Config struct {
	Backend Backend
	// SignIn makes people sign in as one of Users (flowd --auth), each seeing the actions
	// of its role. Without it nobody signs in and every action is shown: the HTTP port
	// listens on loopback by default (docs/security.md).
	SignIn bool
	Users  []User
	// Logger receives the UI's errors (default: discard).
	Logger *slog.Logger
	// SessionTTL is how long a sign-in lasts (default 12h).
	SessionTTL time.Duration
	// HTTPAddr is the address the UI is served on (flowd --http): its host, unless a
	// wildcard such as 0.0.0.0, is one of the names the UI answers to.
	HTTPAddr string
	// Hosts are more names it answers to (flowd --ui-host; ParseHosts checks them): host
	// names or IP addresses, without a port. It always answers to localhost and the
	// loopback addresses; any other Host gets 421 before a page is looked at.
	Hosts []string
	// Proxies are the reverse proxies the operator runs in front of the UI (flowd
	// --ui-proxy; ParseProxies): from these peers X-Forwarded-Proto: https counts as TLS
	// (Secure cookies) and X-Forwarded-For's last address is the client's (the sign-in
	// limits). From anyone else both headers are ignored.
	Proxies []netip.Prefix
}

// hooks switch the UI's guards off for the negative controls of docs/testing.md, or
// replace its clock. The zero value is production; only this package's tests set them,
// and a flowd linked with unsafeAnyHost set (clustertest) turns the Host allow-list off.
type hooks struct {
	anyHost          bool // the Host allow-list is not checked
	originIsHost     bool // a POST's Origin is compared with its own Host (as before the allow-list), not with the names
	noDummyHash      bool // an unknown user is answered without a bcrypt comparison
	noSignInLimit    bool // failed sign-ins are not counted
	noStreamDeadline bool // the live stream keeps the server's write deadline
	perStreamReads   bool // each live stream reads its run, caught up with the log, at each change (as before the shared watcher)
	now              func() time.Time
	compare          func(hash, password []byte) error
}

// unsafeAnyHost, set at link time (-ldflags "-X
// github.com/flowrun/flow/internal/app/webui.unsafeAnyHost=1"), switches the Host
// allow-list off, alone: any Host is answered (a POST's Origin must still be one of the
// UI's names). Only clustertest's negative control builds such a flowd.
var unsafeAnyHost string

// Server serves the UI under /ui/.
type Server struct {
	cfg    Config
	hosts  hostPolicy
	pages  map[string]*template.Template
	static map[string]staticFile
	mux    *http.ServeMux
	signIn *signIn
	hooks  hooks

	ctx    context.Context // ends the live streams at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	live   *liveStreams // the live streams held, and their runs' watchers (a test may replace it before any request: newLiveStreams(0, 0) bounds nothing)

	key [32]byte // for anonymous sessions' CSRF tokens

	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	user, role, csrf string
	expires          time.Time
}

// New makes the UI's server.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("webui: a Backend is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	for i, u := range cfg.Users {
		if u.Name == "" || u.Password == "" || !slices.Contains(peopleRoles, u.Role) {
			return nil, fmt.Errorf("webui: user %d: a name, a password and a role (%s) are required", i+1, strings.Join(peopleRoles, ", "))
		}
	}
	hosts, err := newHostPolicy(cfg.HTTPAddr, cfg.Hosts)
	if err != nil {
		return nil, fmt.Errorf("webui: --ui-host %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	static, err := loadStatic()
	if err != nil {
		return nil, err
	}
	si, costs, err := newSignIn(cfg.Users, cfg.SignIn || len(cfg.Users) > 0)
	if err != nil {
		return nil, err
	}
	if len(costs) > 1 {
		cfg.Logger.Warn("ui: the users' bcrypt hashes have different costs: a cheaper one answers a sign-in sooner, which tells its user's name apart; give every hash the same cost",
			"costs", costs)
	}
	s := &Server{cfg: cfg, hosts: hosts, pages: pages, static: static, signIn: si, sessions: map[string]*session{}}
	if unsafeAnyHost != "" {
		s.hooks.anyHost = true // the Host allow-list alone: the Origin check stays
	}
	_, _ = rand.Read(s.key[:])
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.live = newLiveStreams(streamsPerUser, streamsPerNode)
	s.routes()
	return s, nil
}

// Close ends the live streams and waits for them.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
}

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /ui/static/", s.serveStatic)
	m.HandleFunc("GET /ui/login", s.loginPage)
	m.HandleFunc("POST /ui/login", s.login)
	m.HandleFunc("POST /ui/logout", s.action(s.logout))
	m.HandleFunc("GET /ui/{$}", s.page(s.runsPage))
	m.HandleFunc("GET /ui/runs/{id}", s.page(s.runPage))
	m.HandleFunc("GET /ui/runs/{id}/events", s.authed(s.runEvents))
	m.HandleFunc("GET /ui/runs/{id}/logs", s.runLogs)
	m.HandleFunc("POST /ui/runs/{id}/retry", s.action(s.runAction("run.retry")))
	m.HandleFunc("POST /ui/runs/{id}/cancel", s.action(s.runAction("run.cancel")))
	m.HandleFunc("POST /ui/runs/{id}/approve", s.action(s.runAction("run.approve")))
	m.HandleFunc("POST /ui/runs/{id}/reject", s.action(s.runAction("run.reject")))
	m.HandleFunc("POST /ui/runs/{id}/signal", s.action(s.runAction("run.signal")))
	m.HandleFunc("GET /ui/workflows", s.page(s.workflowsPage))
	m.HandleFunc("GET /ui/workflows/{name}", s.page(s.workflowPage))
	m.HandleFunc("GET /ui/cron", s.page(s.cronPage))
	m.HandleFunc("POST /ui/cron/{name}/pause", s.action(s.cronAction("cron.pause")))
	m.HandleFunc("POST /ui/cron/{name}/resume", s.action(s.cronAction("cron.resume")))
	m.HandleFunc("POST /ui/cron/{name}/backfill", s.action(s.cronAction("cron.backfill")))
	m.HandleFunc("GET /ui/dlq", s.page(s.dlqPage))
	m.HandleFunc("GET /ui/dlq/{id}/purge", s.page(s.purgeConfirmPage))
	m.HandleFunc("POST /ui/dlq/{id}/retry", s.action(s.runAction("dlq.retry")))
	m.HandleFunc("POST /ui/dlq/{id}/purge", s.action(s.runAction("dlq.purge")))
	m.HandleFunc("GET /ui/cluster", s.page(s.clusterPage))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusMovedPermanently) })
	s.mux = m
}

// ServeHTTP serves the UI with headers that keep its pages to themselves: no framing,
// no scripts or styles but its own, no sniffing, no referrer to other sites. A request
// to a name the UI does not answer to (a DNS rebinding) gets 421 before anything else.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.hooks.anyHost && !s.hosts.allows(r.Host) {
		misdirected(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	if !s.authEnabled() && !fromLoopback(r) {
		// Without sign-in the UI's actions are everyone's: it answers only this host (an
		// --http other hosts can reach still serves /metrics and the health checks).
		http.Error(w, "the web UI without flowd --auth answers only this host: give flowd --auth FILE (docs/security.md) to open it to others", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authEnabled says whether people sign in.
func (s *Server) authEnabled() bool { return s.cfg.SignIn || len(s.cfg.Users) > 0 }

// sessionCookieName is the session cookie's name for the port the browser reached: cookies
// ignore ports, and two nodes' UIs on one host must not overwrite each other's.
func sessionCookieName(r *http.Request) string {
	_, port, err := net.SplitHostPort(r.Host)
	if err != nil || port == "" {
		return "flow_session"
	}
	return "flow_session_" + port
}

// sessionOf is the request's session: the signed-in user's, or without sign-in an
// anonymous one with every action, whose CSRF token is derived from its cookie (nothing
// is stored for it: curl and probes make no sessions that pile up).
func (s *Server) sessionOf(w http.ResponseWriter, r *http.Request) *session {
	name := sessionCookieName(r)
	c, err := r.Cookie(name)
	if !s.authEnabled() {
		if err == nil && len(c.Value) == 48 {
			return &session{role: client.RoleAdmin, csrf: s.anonymousCSRF(c.Value)}
		}
		if w == nil {
			return nil
		}
		id := token()
		http.SetCookie(w, s.cookie(r, name, id, time.Time{}))
		return &session{role: client.RoleAdmin, csrf: s.anonymousCSRF(id)}
	}
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.sessions[c.Value]
	if se != nil && s.now().After(se.expires) {
		delete(s.sessions, c.Value)
		se = nil
	}
	return se
}

// anonymousCSRF is the CSRF token of an anonymous session: a MAC of its cookie under a
// key made at start.
func (s *Server) anonymousCSRF(id string) string {
	m := hmac.New(sha256.New, s.key[:])
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) newSession(w http.ResponseWriter, r *http.Request, user, role string) *session {
	now := s.now()
	se := &session{user: user, role: role, csrf: token(), expires: now.Add(s.cfg.SessionTTL)}
	id := token()
	s.mu.Lock()
	for k, old := range s.sessions { // drop the expired while here: the map stays small
		if now.After(old.expires) {
			delete(s.sessions, k)
		}
	}
	s.sessions[id] = se
	s.mu.Unlock()
	http.SetCookie(w, s.cookie(r, sessionCookieName(r), id, se.expires))
	return se
}

// cookie is a session cookie: for the UI's paths only, out of scripts' reach, sent only
// with the UI's own requests, and Secure when the browser reached the UI over TLS (its
// own, or a named proxy's), so that it never travels in the clear afterwards.
func (s *Server) cookie(r *http.Request, name, value string, expires time.Time) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: s.overTLS(r), Expires: expires}
}

// now is the UI's clock (a test's, or the time).
func (s *Server) now() time.Time {
	if s.hooks.now != nil {
		return s.hooks.now()
	}
	return time.Now()
}

func token() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// authed wraps a GET handler that needs a session (a sign-in with users).
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		se := s.sessionOf(w, r)
		if se == nil {
			http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		h(w, r, se)
	}
}

// action wraps a POST: a session, its CSRF token, and the same origin.
func (s *Server) action(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		se := s.sessionOf(nil, r)
		if se == nil {
			http.Error(w, "sign in first: /ui/login", http.StatusUnauthorized)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "a form of at most 64 KiB is expected", http.StatusBadRequest)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(se.csrf)) != 1 || !s.fromOurPages(r) {
			http.Error(w, "this form is stale or not from this page: reload the page and try again", http.StatusForbidden)
			return
		}
		h(w, r, se)
	}
}

// runAction is a POST of retry, cancel, approve, reject, signal, DLQ retry or purge of
// the run in the path: it needs the operation's role (an approval's approvers role is
// the engine's to check), and goes back to the page it came from.
func (s *Server) runAction(op string) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, se *session) {
		if !client.RoleAllows(se.role, op) {
			http.Error(w, fmt.Sprintf("not authorized: %s needs the %s role", op, client.RoleFor(op)), http.StatusForbidden)
			return
		}
		id := r.PathValue("id")
		req := client.Request{ID: id}
		switch op {
		case "run.cancel":
			req.Name = "cancelled from the web UI"
		case "run.approve", "run.reject":
			req.Step, req.Comment = r.PostFormValue("step"), r.PostFormValue("comment")
		case "run.retry":
			req.From = strings.TrimSpace(r.PostFormValue("from"))
			for _, line := range strings.Split(r.PostFormValue("inputs"), "\n") {
				if line = strings.TrimSpace(line); line == "" {
					continue
				}
				k, v, ok := strings.Cut(line, "=")
				if !ok || strings.TrimSpace(k) == "" {
					s.errorPage(w, r, se, &client.Error{Code: client.CodeBadRequest, Message: fmt.Sprintf("input %q: use KEY=VALUE, one a line; nothing was retried", line)})
					return
				}
				if req.Inputs == nil {
					req.Inputs = map[string]string{}
				}
				req.Inputs[strings.TrimSpace(k)] = v
			}
		case "run.signal":
			req.Name = strings.TrimSpace(r.PostFormValue("name"))
			if data := strings.TrimSpace(r.PostFormValue("data")); data != "" {
				if !json.Valid([]byte(data)) {
					s.errorPage(w, r, se, &client.Error{Code: client.CodeBadRequest, Message: "the signal's data is not valid JSON (a string is quoted: \"text\"); nothing was sent"})
					return
				}
				req.Data = json.RawMessage(data)
			}
		}
		ctx := audit.WithActor(r.Context(), se.user)
		if _, err := s.cfg.Backend.Do(ctx, op, req); err != nil {
			s.errorPage(w, r, se, err)
			return
		}
		back := "/ui/runs/" + url.PathEscape(id)
		if op == "dlq.purge" {
			back = "/ui/dlq"
		}
		http.Redirect(w, r, back, http.StatusSeeOther)
	}
}

// cronAction is a POST of pause or resume of the schedule of the workflow in the path
// (a pause with the form's reason): it needs the operation's role, and goes back to
// the cron page.
func (s *Server) cronAction(op string) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, se *session) {
		if !client.RoleAllows(se.role, op) {
			http.Error(w, fmt.Sprintf("not authorized: %s needs the %s role", op, client.RoleFor(op)), http.StatusForbidden)
			return
		}
		req := client.Request{Workflow: r.PathValue("name")}
		switch op {
		case "cron.pause":
			req.Reason = strings.TrimSpace(r.PostFormValue("reason"))
		case "cron.backfill": // the range's ticks without a run, each with its tick's run ID
			req.From, req.To = strings.TrimSpace(r.PostFormValue("from")), strings.TrimSpace(r.PostFormValue("to"))
			req.OnlyMissed = r.PostFormValue("only_missed") != ""
			req.DryRun = r.PostFormValue("dry_run") != ""
		}
		if _, err := s.cfg.Backend.Do(audit.WithActor(r.Context(), se.user), op, req); err != nil {
			s.errorPage(w, r, se, err)
			return
		}
		http.Redirect(w, r, "/ui/cron", http.StatusSeeOther)
	}
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if !s.authEnabled() {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	s.render(w, r, nil, "login", http.StatusOK, viewOf(nil, true, "Sign in", loginView{Next: safeNext(r.URL.Query().Get("next"))}))
}

type loginView struct {
	Next, Error string
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	if c, err := r.Cookie(sessionCookieName(r)); err == nil {
		s.mu.Lock()
		delete(s.sessions, c.Value)
		s.mu.Unlock()
	}
	gone := s.cookie(r, sessionCookieName(r), "", time.Time{})
	gone.MaxAge = -1
	http.SetCookie(w, gone)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// safeNext keeps a redirect after sign-in on the UI.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/"
	}
	return next
}

// pageNames are the templates in assets/templates, each with the layout.
var pageNames = []string{"runs", "run", "workflows", "workflow", "cron", "dlq", "purge", "cluster", "login", "error"}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "assets/templates/layout.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("webui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
