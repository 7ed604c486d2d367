package webui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/apiserver"
	"github.com/flowrun/flow/internal/audit"
)

//go:embed assets
var assets embed.FS

// Backend is what the UI reads and asks of the node: the API's operations in process
// (the same answers flowctl gets) and a few reads of its own.
type Backend interface {
	Do(ctx context.Context, op string, req client.Request) (any, error)
	RunsPage(ctx context.Context, workflow, status, before string, limit int) ([]client.Run, string, error)
	RunsWithIDPrefix(ctx context.Context, prefix string, limit int) ([]client.Run, error)
	StepNeeds(workflow string, version int) ([]apiserver.StepNeeds, error)
	Versions(workflow string) ([]client.Workflow, error)
	Ticks(workflow string, n int) ([]client.Tick, error)
	Changed() <-chan struct{}
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
}

// Server serves the UI under /ui/.
type Server struct {
	cfg    Config
	pages  map[string]*template.Template
	static http.Handler
	mux    *http.ServeMux

	ctx    context.Context // ends the live streams at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

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
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	static, _ := fs.Sub(assets, "assets")
	s := &Server{cfg: cfg, pages: pages, static: http.StripPrefix("/ui/static/", http.FileServer(http.FS(static))),
		sessions: map[string]*session{}}
	_, _ = rand.Read(s.key[:])
	s.ctx, s.cancel = context.WithCancel(context.Background())
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
	m.Handle("GET /ui/static/", s.static)
	m.HandleFunc("GET /ui/login", s.loginPage)
	m.HandleFunc("POST /ui/login", s.login)
	m.HandleFunc("POST /ui/logout", s.action(s.logout))
	m.HandleFunc("GET /ui/{$}", s.page(s.runsPage))
	m.HandleFunc("GET /ui/runs/{id}", s.page(s.runPage))
	m.HandleFunc("GET /ui/runs/{id}/events", s.authed(s.runEvents))
	m.HandleFunc("POST /ui/runs/{id}/retry", s.action(s.runAction("run.retry")))
	m.HandleFunc("POST /ui/runs/{id}/cancel", s.action(s.runAction("run.cancel")))
	m.HandleFunc("GET /ui/workflows", s.page(s.workflowsPage))
	m.HandleFunc("GET /ui/workflows/{name}", s.page(s.workflowPage))
	m.HandleFunc("GET /ui/cron", s.page(s.cronPage))
	m.HandleFunc("GET /ui/dlq", s.page(s.dlqPage))
	m.HandleFunc("GET /ui/dlq/{id}/purge", s.page(s.purgeConfirmPage))
	m.HandleFunc("POST /ui/dlq/{id}/retry", s.action(s.runAction("dlq.retry")))
	m.HandleFunc("POST /ui/dlq/{id}/purge", s.action(s.runAction("dlq.purge")))
	m.HandleFunc("GET /ui/cluster", s.page(s.clusterPage))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusMovedPermanently) })
	s.mux = m
}

// ServeHTTP serves the UI with headers that keep its pages to themselves: no framing,
// no scripts or styles but its own, no sniffing, no referrer to other sites.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// fromLoopback says whether the request came from this host.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
		http.SetCookie(w, &http.Cookie{Name: name, Value: id, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		return &session{role: client.RoleAdmin, csrf: s.anonymousCSRF(id)}
	}
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.sessions[c.Value]
	if se != nil && time.Now().After(se.expires) {
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
	se := &session{user: user, role: role, csrf: token(), expires: time.Now().Add(s.cfg.SessionTTL)}
	id := token()
	s.mu.Lock()
	for k, old := range s.sessions { // drop the expired while here: the map stays small
		if time.Now().After(old.expires) {
			delete(s.sessions, k)
		}
	}
	s.sessions[id] = se
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookieName(r), Value: id, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Expires: se.expires})
	return se
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
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(se.csrf)) != 1 || !sameOrigin(r) {
			http.Error(w, "this form is stale or not from this page: reload the page and try again", http.StatusForbidden)
			return
		}
		h(w, r, se)
	}
}

// sameOrigin checks the Origin header when the browser sends one.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return o == ""
	}
	return strings.TrimPrefix(strings.TrimPrefix(o, "http://"), "https://") == r.Host
}

// runAction is a POST of retry, cancel, DLQ retry or purge of the run in the path: it
// needs the operation's role, and goes back to the page it came from.
func (s *Server) runAction(op string) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, se *session) {
		if !client.RoleAllows(se.role, op) {
			http.Error(w, fmt.Sprintf("not authorized: %s needs the %s role", op, client.RoleFor(op)), http.StatusForbidden)
			return
		}
		id := r.PathValue("id")
		req := client.Request{ID: id}
		if op == "run.cancel" {
			req.Name = "cancelled from the web UI"
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

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if !s.authEnabled() {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil || !sameOrigin(r) {
		http.Error(w, "a sign-in form is expected", http.StatusBadRequest)
		return
	}
	name, pw, next := r.PostFormValue("user"), r.PostFormValue("password"), safeNext(r.PostFormValue("next"))
	for _, u := range s.cfg.Users {
		if u.Name == name && passwordMatches(u.Password, pw) {
			s.newSession(w, r, u.Name, u.Role)
			http.Redirect(w, r, next, http.StatusSeeOther)
			return
		}
	}
	s.render(w, r, nil, "login", http.StatusUnauthorized, viewOf(nil, true, "Sign in", loginView{Next: next, Error: "wrong user or password"}))
}

func passwordMatches(stored, given string) bool {
	if strings.HasPrefix(stored, "$2") {
		return bcrypt.CompareHashAndPassword([]byte(stored), []byte(given)) == nil
	}
	return subtle.ConstantTimeCompare([]byte(stored), []byte(given)) == 1
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	if c, err := r.Cookie(sessionCookieName(r)); err == nil {
		s.mu.Lock()
		delete(s.sessions, c.Value)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookieName(r), Value: "", Path: "/ui/", MaxAge: -1})
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
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/templates/layout.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("webui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
