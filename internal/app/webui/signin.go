package webui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Sign-in (docs/ui.md, "Sign-in limits"). Three things keep the password check from
// being a way in or a way down:
//   - Every attempt costs one bcrypt comparison, whoever it names: a known user's hash,
//     or for an unknown user (and for a plain-text password in the --auth file) a dummy
//     hash of the users' cost. An unknown name is not answered sooner than a known one.
//   - Failures are counted per user name and per client address; after
//     signInFailures of them the key is locked out, for a time that doubles with each
//     further failure (up to signInMaxLock), answered 429 with Retry-After and without
//     checking the password (the right one too). A success clears its user's count (not
//     its address's: one valid account must not buy guesses at others). Unknown names
//     are counted like known ones, so a lockout tells nothing either.
//   - At most signInHashing comparisons run at once: a flood of sign-ins cannot take the
//     node's cores from its runs. The excess waits up to signInWait, then gets 503.

const (
	signInFailures = 5                // failures before a key is locked out
	signInLock     = time.Second      // the first lockout; each further failure doubles it
	signInMaxLock  = 15 * time.Minute // the longest lockout
	signInForget   = time.Hour        // a key quiet this long after its lockout is forgotten
	signInKeys     = 10000            // keys remembered at most (the oldest quiet ones go first)
	signInHashing  = 2                // comparisons at once
	signInWait     = 5 * time.Second  // how long a sign-in waits for its turn
	signInWaiting  = 64               // sign-ins waiting at most; more get 503 at once
)

// signIn is the sign-in's state: users by name, the dummy hash, the limits and the
// semaphore.
type signIn struct {
	users map[string]User
	dummy []byte // bcrypt of a random password, at the users' cost
	lim   limiter
	sem   chan struct{}
	queue atomic.Int32 // sign-ins waiting for the semaphore
	wait  time.Duration
}

// newSignIn prepares the sign-in of users. The dummy hash takes the highest cost among
// the users' bcrypt hashes (bcrypt's default, 10, when none is hashed); different costs
// are warned about, since a cheaper hash answers sooner.
func newSignIn(users []User, enabled bool) (*signIn, []int, error) {
	si := &signIn{users: map[string]User{}, sem: make(chan struct{}, signInHashing), wait: signInWait,
		lim: limiter{after: signInFailures, base: signInLock, max: signInMaxLock, forget: signInForget, size: signInKeys}}
	var costs []int
	for _, u := range users {
		if _, dup := si.users[u.Name]; !dup {
			si.users[u.Name] = u
		}
		if isBcrypt(u.Password) {
			c, err := bcrypt.Cost([]byte(u.Password))
			if err != nil { // (the error would quote part of it)
				return nil, nil, fmt.Errorf("webui: user %s: its password starts as a bcrypt hash does ($2) but is not one: put a whole hash (htpasswd -bnBC 11 \"\" PASSWORD | tr -d ':\\n') in the --auth file", u.Name)
			}
			if !slices.Contains(costs, c) {
				costs = append(costs, c)
			}
		}
	}
	cost := bcrypt.DefaultCost
	if len(costs) > 0 {
		cost = slices.Max(costs)
	}
	if enabled {
		var pw [18]byte
		_, _ = rand.Read(pw[:])
		d, err := bcrypt.GenerateFromPassword(pw[:], cost)
		if err != nil {
			return nil, nil, fmt.Errorf("webui: the dummy hash: %w", err)
		}
		si.dummy = d
	}
	slices.Sort(costs)
	return si, costs, nil
}

func isBcrypt(stored string) bool { return strings.HasPrefix(stored, "$2") }

// checkPassword compares the password given for name: exactly one bcrypt comparison, whatever
// name is.
func (s *Server) checkPassword(name, given string) bool {
	compare := bcrypt.CompareHashAndPassword
	if s.hooks.compare != nil {
		compare = s.hooks.compare
	}
	u, known := s.signIn.users[name]
	switch {
	case known && isBcrypt(u.Password):
		return compare([]byte(u.Password), []byte(given)) == nil
	case known: // a plain-text password costs what a hashed one costs
		_ = compare(s.signIn.dummy, []byte(given))
		return subtle.ConstantTimeCompare([]byte(u.Password), []byte(given)) == 1
	default:
		if !s.hooks.noDummyHash {
			_ = compare(s.signIn.dummy, []byte(given))
		}
		return false
	}
}

// acquire waits for a turn to compare a password, up to the sign-in's wait.
func (si *signIn) acquire(ctx context.Context) bool {
	if si.queue.Add(1) > signInWaiting {
		si.queue.Add(-1)
		return false
	}
	defer si.queue.Add(-1)
	t := time.NewTimer(si.wait)
	defer t.Stop()
	select {
	case si.sem <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (si *signIn) release() { <-si.sem }

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if !s.authEnabled() {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil || !s.fromOurPages(r) {
		http.Error(w, "a sign-in form from this UI's page is expected", http.StatusBadRequest)
		return
	}
	name, pw, next := r.PostFormValue("user"), r.PostFormValue("password"), safeNext(r.PostFormValue("next"))
	client := s.clientAddr(r)
	keys := []limitKey{userKey(name), addrKey(client)}
	refuse := func(code int, retry time.Duration, msg string) {
		w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
		s.render(w, r, nil, "login", code, viewOf(nil, true, "Sign in", loginView{Next: next, Error: msg}))
	}
	if d := s.lockedFor(keys); d > 0 {
		refuse(http.StatusTooManyRequests, d, lockedMessage(d))
		return
	}
	if !s.signIn.acquire(r.Context()) {
		refuse(http.StatusServiceUnavailable, time.Second, "too many sign-ins at once: try again in a moment")
		return
	}
	if d := s.lockedFor(keys); d > 0 { // failures recorded while this one waited
		s.signIn.release()
		refuse(http.StatusTooManyRequests, d, lockedMessage(d))
		return
	}
	ok := s.checkPassword(name, pw)
	s.signIn.release()
	if ok {
		s.signIn.lim.succeed(keys[0])
		u := s.signIn.users[name]
		s.newSession(w, r, u.Name, u.Role)
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if !s.hooks.noSignInLimit {
		if d := s.signIn.lim.fail(keys, s.now()); d > 0 {
			shown := name
			if len(shown) > 64 {
				shown = shown[:64] + "..."
			}
			s.cfg.Logger.Warn("ui: sign-ins locked out after failures", "user", shown, "client", client.String(), "for", d)
		}
	}
	s.render(w, r, nil, "login", http.StatusUnauthorized, viewOf(nil, true, "Sign in", loginView{Next: next, Error: "wrong user or password"}))
}

func (s *Server) lockedFor(keys []limitKey) time.Duration {
	if s.hooks.noSignInLimit {
		return 0
	}
	return s.signIn.lim.lockedFor(keys, s.now())
}

func lockedMessage(d time.Duration) string {
	return fmt.Sprintf("too many failed sign-ins for this user or from this address: try again in %s", d.Round(time.Second))
}

// limitKey names what failures are counted for: a user name (hashed: the table's memory
// does not grow with the names' lengths) or a client address (an IPv6 address by its
// /64, which one client usually holds whole).
type limitKey struct {
	kind byte // 'u' or 'a'
	id   [16]byte
}

func userKey(name string) limitKey {
	sum := sha256.Sum256([]byte(name))
	k := limitKey{kind: 'u'}
	copy(k.id[:], sum[:])
	return k
}

func addrKey(a netip.Addr) limitKey {
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return limitKey{kind: 'a', id: a.As16()}
}

// limiter counts failed sign-ins per key and locks a key out after `after` of them.
// Its decisions take the time (tests hold it still or move it).
type limiter struct {
	after     int
	base, max time.Duration
	forget    time.Duration
	size      int
	mu        sync.Mutex
	recs      map[limitKey]*limitRec // guarded by mu
}

type limitRec struct {
	failures int
	until    time.Time // locked out until then
	last     time.Time // the last failure
}

// quiet says whether the key has had no failure and no lockout for forget.
func (rec *limitRec) quiet(now time.Time, forget time.Duration) bool {
	end := rec.last
	if rec.until.After(end) {
		end = rec.until
	}
	return now.Sub(end) > forget
}

// lockedFor is how long the longest lockout of keys still lasts at now (0: none).
func (l *limiter) lockedFor(keys []limitKey, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var d time.Duration
	for _, k := range keys {
		if rec := l.recs[k]; rec != nil && rec.until.After(now) {
			d = max(d, rec.until.Sub(now))
		}
	}
	return d
}

// fail counts a failure for each key; from the after-th on, each locks its key out for
// base, doubled for each failure since, up to max. It returns the longest lockout it
// began (0: none).
func (l *limiter) fail(keys []limitKey, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recs == nil {
		l.recs = map[limitKey]*limitRec{}
	}
	var locked time.Duration
	for _, k := range keys {
		rec := l.recs[k]
		if rec != nil && rec.quiet(now, l.forget) {
			rec = nil // failures long past are forgotten
		}
		if rec == nil {
			delete(l.recs, k)
			l.makeRoom(now)
			rec = &limitRec{}
			l.recs[k] = rec
		}
		rec.failures++
		rec.last = now
		if over := rec.failures - l.after; over >= 0 {
			lock := l.base
			for i := 0; i < over && lock < l.max; i++ {
				lock *= 2
			}
			lock = min(lock, l.max)
			rec.until = now.Add(lock)
			locked = max(locked, lock)
		}
	}
	return locked
}

// succeed forgets the failures of a key (a user who signed in).
func (l *limiter) succeed(k limitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.recs, k)
}

// makeRoom keeps the table under its size: keys quiet for forget after their lockout go
// first; if none is, the one whose last failure is oldest (a flood of names can thus
// shorten a victim's memory, but only at the cost of a bcrypt comparison per name, from
// addresses that are themselves counted).
func (l *limiter) makeRoom(now time.Time) {
	if len(l.recs) < l.size {
		return
	}
	var oldest limitKey
	var oldestAt time.Time
	for k, rec := range l.recs {
		if rec.quiet(now, l.forget) {
			delete(l.recs, k)
			continue
		}
		if oldestAt.IsZero() || rec.last.Before(oldestAt) {
			oldest, oldestAt = k, rec.last
		}
	}
	if len(l.recs) >= l.size {
		delete(l.recs, oldest)
	}
}
